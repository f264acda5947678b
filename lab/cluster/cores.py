"""CPU cores for this process, and their fair split over the processes of one node.

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
