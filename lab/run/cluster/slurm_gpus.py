"""The room's GPU queue through Slurm's GRES: where the DGX runs Slurm, a check's GPUs are a Slurm job's.

DGX BasePOD and SuperPOD nodes run Slurm, which already hands out whole GPUs in turn. There a room's queue is a
partition (`lab room serve --queue-partition gpu`, LAB_GPU_QUEUE=slurm:gpu in each seat): a multi-rank check asks
`salloc --gpus=N --no-shell` for an allocation, waits in Slurm's queue with every other seat's, and runs its
torchrun as a step of it (`srun --jobid`), so Slurm sets the step's CUDA_VISIBLE_DEVICES (and, where the node
constrains devices, lets it open no other GPU). The allocation is cancelled when the check ends, however it ends:
salloc cancels a pending request on Ctrl-C, `scancel` ends a granted one, and `--time` bounds one whose holder was
killed outright.

The check's folder (its traces) must be where the step's node can write: on one DGX it is the same machine.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from lab.errors import LabError

PREFIX = "slurm:"  # LAB_GPU_QUEUE=slurm:PARTITION
JOB_NAME = "lab-check-"  # each lease's job is named for its seat: squeue -n shows the room's checks
GRACE_SECONDS = 120  # an allocation's --time beyond its check's limit: a killed holder's job ends by itself


def partition_of(queue: str) -> str | None:
    """The partition where `queue` (LAB_GPU_QUEUE's value) names one, else None (a local queue's folder).

    >>> partition_of("slurm:gpu"), partition_of("/srv/room-gpu-queue")
    ('gpu', None)
    """
    return queue[len(PREFIX) :] if queue.startswith(PREFIX) else None


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the Slurm job variables of a seat that is itself a Slurm job (--spawner slurm): srun and salloc
    read SLURM_MEM_PER_NODE, SLURM_CPU_BIND, SLURM_JOB_ID ... as if given on their command line. SLURM_CONF stays.

    >>> sorted(clean_env({"SLURM_CONF": "c", "SLURM_MEM_PER_NODE": "9", "SRUN_X": "1", "PATH": "/bin"}))
    ['PATH', 'SLURM_CONF']
    """
    return {k: v for k, v in env.items() if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SRUN_", "SALLOC_"))}


def _slurm(argv: list[str], timeout: float | None = 60) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        raise LabError(f"{argv[0]} not found: the GPU queue through Slurm needs Slurm's client commands on this host")
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=clean_env(os.environ)
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{argv[0]} did not answer within {timeout:g} s: is slurmctld up? (scontrol ping)") from exc


@dataclass(frozen=True)
class Partition:
    name: str
    gpus_per_node: int  # the most GPUs one node has (its Gres)
    time_limit_minutes: int | None  # None: no limit


def partition(name: str, said_as: str | None = None) -> Partition:
    """What a lease needs of partition `name`, in one sinfo: the most GPUs one node has (its Gres, as sinfo prints
    it: "gpu:8", "gpu:h100:8(S:0-1)") and its time limit. `said_as`: how the user gave the partition, for the line
    that says it is not there.

    >>> _gres_count("gpu:h100:8(S:0-1),nic:2"), _gres_count("gpu:2"), _gres_count("(null)")
    (8, 2, 0)
    """
    done = _slurm(["sinfo", "--noheader", f"--partition={name}", "--format=%G|%l"])
    rows = [line.split("|", 1) for line in done.stdout.split()]
    if done.returncode != 0 or not rows:
        raise LabError(
            f"{said_as or PREFIX + name}: Slurm has no partition {name!r} "
            f"({done.stderr.strip() or 'sinfo lists no node in it'}); give one whose nodes have GPUs (sinfo -o '%P %G')"
        )
    limits = [m for m in (_minutes(row[-1]) for row in rows) if m]
    return Partition(name, max(_gres_count(row[0]) for row in rows), min(limits) if limits else None)


def _gres_count(gres: str) -> int:
    found = [int(m[1]) for m in re.finditer(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)", gres)]
    return max(found, default=0)


@dataclass
class Allocation:
    job_id: str
    node: str
    devices: tuple[str, ...]  # the GPUs' indices on the node (scontrol's IDX), as the step's CUDA_VISIBLE_DEVICES

    def launcher(self, count: int) -> tuple[str, ...]:
        """The prefix that runs a command as a step of this allocation, on its GPUs, with the caller's environment
        (less a seat job's own Slurm variables: gpu_queue.on_leased). One Ctrl-C ends the step (--quit-on-interrupt)."""
        return (
            "srun",
            f"--jobid={self.job_id}",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={count}",
            f"--gpus={count}",
            "--kill-on-bad-exit=1",
            "--quit-on-interrupt",
            "--export=ALL",
            "--quiet",
        )


def allocate(partition: Partition, count: int, who: str, hold_seconds: float | None) -> tuple[Allocation, float]:
    """`count` GPUs of one node of `partition`, waited for in Slurm's queue; the allocation and the wait. Whatever
    ends the wait or the placement's read (Ctrl-C, an error), the request is cancelled: pending or granted, no
    allocation outlives its caller's interest (the job's name is this process's own)."""
    minutes = math.ceil(((hold_seconds or 3600.0) + GRACE_SECONDS) / 60)
    limit = partition.time_limit_minutes
    name = f"{JOB_NAME}{who}.{os.getpid()}"
    started = time.monotonic()
    try:
        done = _slurm(
            [
                "salloc",
                f"--partition={partition.name}",
                "--nodes=1",
                "--ntasks=1",
                f"--cpus-per-task={count}",
                f"--gpus={count}",
                f"--job-name={name}",
                f"--time={min(minutes, limit) if limit else minutes}",
                "--no-shell",
            ],
            timeout=None,  # the queue's wait is the point
        )
        waited = time.monotonic() - started
        granted = re.search(r"Granted job allocation (\d+)", done.stderr)
        if done.returncode != 0 or not granted:
            raise LabError(
                f"salloc --partition={partition.name} --gpus={count}: {done.stderr.strip() or 'no allocation'}"
            )
        node, devices = _placement(granted[1])
    except BaseException:
        subprocess.run(
            ["scancel", f"--name={name}"], capture_output=True, check=False, timeout=60, env=clean_env(os.environ)
        )
        raise
    return Allocation(granted[1], node, devices), waited


def _minutes(limit: str) -> int | None:
    """A time limit as sinfo's %l prints it, in minutes; None for none.

    >>> [_minutes(t) for t in ("1:00:00", "2-00:00:00", "30", "infinite", "45:30")]
    [60, 2880, 30, None, 45]
    """
    days, _, clock = limit.rpartition("-") if "-" in limit else ("0", "", limit)
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not days.isdigit():
        return None  # infinite, UNLIMITED, n/a
    if len(parts) > 3:
        return None
    hours, minutes = (parts[0], parts[1]) if len(parts) == 3 else ("0", parts[0])  # H:M:S, M:S or M
    return int(days) * 1440 + int(hours) * 60 + int(minutes)


def _placement(job_id: str) -> tuple[str, tuple[str, ...]]:
    """The node and GPU indices of a granted job (scontrol show job -d: "Nodes=g1 CPU_IDs=0-1 ... GRES=gpu:2(IDX:0-1)").

    >>> _indices("0-1,4"), _indices("3")
    (('0', '1', '4'), ('3',))
    """
    text = _slurm(["scontrol", "show", "job", "--details", job_id]).stdout
    placed = re.search(r"\bNodes=(\S+) CPU_IDs=\S+.*?GRES=\S*?gpu[^(,\s]*\(IDX:([0-9,\-]+)\)", text)
    if not placed:
        return "?", ()
    return placed[1], _indices(placed[2])


def _indices(ranges: str) -> tuple[str, ...]:
    found: list[str] = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        found += [str(i) for i in range(int(first), int(last or first) + 1)]
    return tuple(found)


def cancel(job_id: str) -> None:
    _slurm(["scancel", job_id])


def holders(partition: str) -> list[dict[str, str]]:
    """The room's checks in Slurm's queue now: each one's seat, state (RUNNING, PENDING), node and time."""
    done = _slurm(["squeue", "--noheader", f"--partition={partition}", "--format=%j|%T|%N|%M|%b"])
    found = []
    for line in done.stdout.splitlines():
        name, state, node, elapsed, gres = (line.split("|") + [""] * 5)[:5]
        if name.startswith(JOB_NAME):
            who = name[len(JOB_NAME) :].rpartition(".")[0] or name[len(JOB_NAME) :]  # lab-check-SEAT.PID
            found.append({"who": who, "state": state, "node": node, "time": elapsed, "gres": gres})
    return found


@contextlib.contextmanager
def allocation(
    partition: Partition, count: int, who: str, hold_seconds: float | None
) -> Iterator[tuple[Allocation, float]]:
    """An allocation for the block, cancelled after it however the block ends."""
    granted, waited = allocate(partition, count, who, hold_seconds)
    try:
        yield granted, waited
    finally:
        cancel(granted.job_id)
