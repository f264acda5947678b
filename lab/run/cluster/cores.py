"""The processors of this node: CPU cores for this process and their fair split over the processes of one
node, the GPUs, and how many ranks a command starts when it is not told.

A 1-process baseline with 2 threads and a 2-process DDP run with 1 thread each use
the same cores, which is the only fair CPU comparison. OMP_NUM_THREADS, when the
user sets it, wins.
"""

from __future__ import annotations

import os


def available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_process(processes_on_node: int) -> int:
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, available() // max(1, processes_on_node))


def gpu_count() -> int:
    """CUDA devices this process can use (imports torch: seconds, so only when a default needs it)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_ranks(gpus: int, fewest_gpus: int = 1, cpu_ranks: int = 2) -> int:
    """The lab's one rule for a rank count nobody gave: one rank per GPU where there are at least `fewest_gpus`
    of them, else `cpu_ranks` CPU processes (the smallest world with a collective in it).

    Benchmarks run on a single GPU too (fewest_gpus=1); what compares ranks (a pitfall, a lesson, the workshop)
    needs two devices and takes 2 CPU processes on a 1-GPU host (fewest_gpus=2); scaling's largest world is
    every core (cpu_ranks=available()).

    >>> (default_ranks(8), default_ranks(1), default_ranks(0), default_ranks(1, fewest_gpus=2),
    ...  default_ranks(0, cpu_ranks=16))
    (8, 1, 2, 2, 16)
    """
    return gpus if gpus >= max(1, fewest_gpus) else cpu_ranks
