"""A check's multi-rank runs on the room's GPU queue (lab.run.cluster.gpu_queue): the lease, said with its wait, where
the runs' traces go, and a note when the leased GPUs went unused.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from lab.run.cluster import cores, gpu_queue


def _say(text: str) -> None:
    print(f"lab exercise check: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def gpus_for(world_size: int | None, hold_seconds: float | None = None) -> Iterator[gpu_queue.Lease | None]:
    """A multi-rank run's GPUs from the room's queue (through Slurm where the room's queue is a partition), where
    the seat has fewer of its own than ranks and the room keeps one; None otherwise. Said on stderr, with the wait:
    the learner sees why the check had not started."""
    if not world_size or world_size < 2 or cores.gpu_count() >= world_size or gpu_queue.configured() is None:
        yield None
        return
    _say(f"waiting for {world_size} GPUs from the room's queue ...")
    with gpu_queue.lease(world_size, hold_seconds=hold_seconds) as leased:
        if leased is None:
            _say(f"the room's queue has fewer than {world_size} GPUs: this run is on the CPU")
        else:
            _say(f"{leased.said} (the limit counts from here)")
        yield leased


def trace_root(leased: gpu_queue.Lease | None) -> str | None:
    """Where a run's traces go: the system's temporary folder, but under the home folder for a Slurm step (a site
    with job_container/tmpfs gives each job a /tmp of its own, where the grader would never see them)."""
    if leased is None or not leased.launcher:
        return None
    root = Path.home() / ".cache" / "lab-checks"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return str(root)


def say_if_unused(leased: gpu_queue.Lease | None, backend: str | None, label: str) -> None:
    """A run given GPUs whose ranks made a process group of another backend than NCCL ran on the CPU: graded all
    the same (the learner's code chose), but said, so a check that never touched the GPUs does not pass unseen."""
    if leased is not None and backend not in (None, "nccl"):
        _say(f"note: {label} ran over {backend}, not on the leased GPUs {leased.visible} (torch saw no GPU there)")
