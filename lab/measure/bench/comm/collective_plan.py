"""What `lab bench allreduce` and `lab bench collective` are asked to run: the sizes, the ops, the reduction,
the link, where each op's JSON goes and the test hook's rank; bad input refused before torch is imported.

>>> parse_size("256M"), parse_size("8"), parse_size("1G")
(268435456, 8, 1073741824)
>>> json_paths("out/c.json", ["all_gather"]), json_paths("out/c.json", ["all_gather", "sendrecv"])["sendrecv"]
({'all_gather': 'out/c.json'}, 'out/c-sendrecv.json')
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from lab.errors import LabError
from lab.measure.bench.comm.collective import COLLECTIVES, parse_names

SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}  # nccl-tests' parsesize: binary multiples
REDOPS = ("sum", "avg", "max")
# The test hook of each command: global rank R sends one wrong element, so #wrong must not be 0. "R" for
# every op, "R:OP" for that op alone (one job can then show clean results and a corrupted one).
CORRUPT_ENV = {"allreduce": "LAB_ALLREDUCE_CORRUPT_RANK", "collective": "LAB_COLLECTIVE_CORRUPT_RANK"}

# Unidirectional bandwidth of common links, GB/s: what a ring's busbw can at best approach. The "% of link" figure
# keeps this reference, the number NVIDIA states and the validate role's floors cite, rather than a measured
# peak; where NVLS (NCCL's in-switch reduction on NVSwitch, e.g. all-reduce on 8 H100s: ~480 GB/s busbw) passes
# it, the figure says why instead of being capped (lab.measure.bench.comm.collective_perf.link_share).
LINKS: dict[str, tuple[float, str]] = {
    "nvlink4": (450.0, "NVLink 4 (H100/H200 SXM), per GPU per direction"),
    "nvlink3": (300.0, "NVLink 3 (A100 SXM), per GPU per direction"),
    "ndr-ib": (50.0, "InfiniBand NDR 400 Gb/s, per NIC"),
    "hdr-ib": (25.0, "InfiniBand HDR 200 Gb/s, per NIC"),
    "pcie5": (64.0, "PCIe Gen5 x16, per direction"),
    "pcie4": (32.0, "PCIe Gen4 x16, per direction"),
    "100gbe": (12.5, "100 Gb Ethernet"),
}


def parse_size(text: str) -> int:
    value = text.strip().upper()
    number, suffix = (value[:-1], value[-1]) if value and value[-1] in SUFFIX else (value, "")
    try:
        size = int(float(number) * SUFFIX[suffix])
    except ValueError:
        raise LabError(f"size {text!r}: expected bytes with an optional K, M or G suffix, e.g. 8, 64K, 256M") from None
    if size < 1:
        raise LabError(f"size {text!r}: must be at least 1 byte")
    return size


def size_steps(begin: int, end: int, factor: float) -> list[int]:
    """-b, -e, -f: begin, end and multiplication factor, as in nccl-tests."""
    if end < begin:
        raise LabError(f"-e {end} is below -b {begin}; the largest size must not be smaller than the smallest")
    if factor <= 1:
        raise LabError(f"-f {factor}: the step factor must be above 1")
    sizes, size = [], begin
    while size <= end:
        sizes.append(size)
        size = int(size * factor)
    return sizes


@dataclass(frozen=True)
class Request:
    names: list[str]  # the collectives, in the order they run
    sizes: list[int]
    op: str  # the reduction of the ops that reduce


def expected_backend() -> str:
    """The backend lab.run.cluster.dist will choose for this process with DistConfig's defaults: nccl on CUDA, else
    gloo."""
    from lab.run.cluster import dist
    from lab.run.config import DistConfig

    cfg = DistConfig()
    return dist.choose_backend(cfg.backend, dist.choose_device(cfg.device, 0))


def plan(args: argparse.Namespace, benchmark: str) -> Request:
    """What `args` ask of `lab bench allreduce` or `lab bench collective`, refused here when it cannot be run:
    the parent of --nproc-per-node calls it too, so bad input is one line and exit 2, not a worker's failure.
    torch is imported (to know the backend) only when the answer depends on it."""
    sizes = size_steps(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    if args.link and args.link not in LINKS:
        raise LabError(f"--link {args.link}: unknown; known links: {', '.join(LINKS)}")
    if args.op is not None and args.op not in REDOPS:
        raise LabError(f"--op {args.op}: expected one of {', '.join(REDOPS)}")
    names = ["all_reduce"] if benchmark == "allreduce" else parse_names(args.collectives)
    backend = expected_backend() if args.op == "avg" else None
    reducing = [n for n in names if COLLECTIVES[n].reduces]
    if args.op is not None and not reducing:
        raise LabError(
            f"--op {args.op}: {', '.join(names)} reduce nothing; --op is the reduction of all_reduce and reduce_scatter"
        )
    if args.op == "avg" and backend == "gloo" and reducing:
        raise LabError("--op avg: the gloo backend has no AVG reduction; use --op sum (or NCCL on GPUs)")
    return Request(names, sizes, args.op or "sum")


def one_rank(benchmark: str) -> LabError:
    what = "an all-reduce" if benchmark == "allreduce" else "a collective"
    # One rank sends nothing: the "collective" is a no-op, its time ~0 and its algbw meaningless
    # (thousands of GB/s on a CPU; a division by a zero event time on CUDA).
    return LabError(
        f"lab bench {benchmark}: 1 rank: {what} over one process moves no data, so there is nothing to "
        f"measure; use --nproc-per-node 2 or more, or torchrun over several nodes"
    )


def json_paths(path: str, names: list[str]) -> dict[str, str]:
    """Where each op's JSON goes: `path` for one op; with several, `path` with -OP before its suffix."""
    if len(names) == 1:
        return {names[0]: path}
    p = Path(path)
    return {name: str(p.with_name(f"{p.stem}-{name}{p.suffix}")) for name in names}


def corrupt_rank(benchmark: str, name: str) -> int | None:
    """The test hook's rank for op `name`, or None (CORRUPT_ENV)."""
    rank, _, only = os.environ.get(CORRUPT_ENV[benchmark], "").partition(":")
    return int(rank) if rank and only in ("", name) else None
