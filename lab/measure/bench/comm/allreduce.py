"""All-reduce bandwidth with nccl-tests' columns and definitions, over torch.distributed.

    lab bench allreduce -b 8 -e 256M -f 2 --nproc-per-node 8      # one node
    torchrun --nnodes 2 ... -m lab bench allreduce -b 1M -e 1G     # many nodes, no MPI

Definitions (nccl-tests, doc/PERFORMANCE.md):
    algbw = bytes / time                      GB/s with GB = 1e9 bytes
    busbw = algbw * 2 (n - 1) / n             what each link carries in a ring all-reduce

time is the mean over `-n` iterations after `-w` warm-ups, averaged over ranks.
Out-of-place: torch.distributed has no out-of-place all-reduce, so the lab copies the
input into a separate output buffer and reduces that (the copy is in the time);
in-place: the reduction runs on the input buffer itself.

This is `lab bench collective all_reduce` with its own JSON ("benchmark": "allreduce", no "collective"
key), test hook (LAB_ALLREDUCE_CORRUPT_RANK) and --pushgateway series: the table, timing and check are
lab.measure.bench.comm.collective_perf's, the all-reduce itself lab.measure.bench.comm.collective's.

>>> round(busbw(algbw(1e9, 0.1), 8), 6)    # 1 GB in 100 ms over 8 ranks
17.5
"""

from __future__ import annotations

import argparse

from lab.measure.bench.comm import collective_perf
from lab.measure.bench.comm.collective import COLLECTIVES
from lab.measure.bench.comm.collective_perf import algbw
from lab.measure.bench.comm.collective_plan import LINKS

__all__ = [
    "LINKS",
    "algbw",
    "busbw",
    "run",
]  # LINKS: the validate role's floors cite lab.measure.bench.comm.allreduce.LINKS


def busbw(algbw_gbps: float, world_size: int) -> float:
    return algbw_gbps * COLLECTIVES["all_reduce"].factor(world_size)


def run(args: argparse.Namespace) -> int:
    """One rank of `lab bench allreduce`; returns the exit code (3 when --min-busbw is missed)."""
    return collective_perf.run(args, "allreduce")
