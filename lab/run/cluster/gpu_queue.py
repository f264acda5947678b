"""The room's GPU queue: whole GPUs that no seat owns, leased for a moment by any seat's multi-rank run.

A DGX has 8 GPUs and a class has 8 to 24 learners; DDP wants a GPU per rank, and NCCL does not run DDP across MIG
slices. So a room can keep a few whole GPUs out of the seats (`lab room plan --queue-gpus 2`) and every seat's
multi-rank exercise check leases as many as it has ranks, runs on them (CUDA_VISIBLE_DEVICES set to them) and gives
them back: a check is seconds of GPU time, so 24 learners checking at once wait in turn for minutes, not for a GPU
of their own.

The queue is a folder the room prepares (`lab room serve`): one lock file per GPU and `queue.lock`. A lease takes
`queue.lock` (the kernel's flock: the ones waiting queue behind it), then the first free GPUs (each its own flock),
and lets the next in. The kernel releases a lease when its process ends, however it ends: a killed check leaves no
GPU taken. Each GPU's file holds who leased it and since when (`lab room status` shows them).

    with gpu_queue.lease(2) as leased:     # None: no queue here, or fewer GPUs in it than ranks
        env["CUDA_VISIBLE_DEVICES"] = leased.visible

Where the host runs Slurm, the queue can be a partition instead (LAB_GPU_QUEUE=slurm:PARTITION,
lab.run.cluster.slurm_gpus): the lease is a Slurm allocation, and the run goes inside it (`leased.launcher`), where
Slurm sets CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lab.errors import LabError
from lab.run.cluster import slurm_gpus

QUEUE_ENV = "LAB_GPU_QUEUE"  # the queue's folder (or slurm:PARTITION), in a seat's environment where the room has one
QUEUE_LOCK = "queue.lock"
POLL_SECONDS = 0.05  # the head of the queue looks for free GPUs this often


def lock_path(folder: Path, device: str) -> Path:
    return Path(folder) / f"gpu-{device}.lock"


def prepare(folder: Path, devices: tuple[str, ...]) -> Path:
    """The queue's folder for `devices` (by the room's owner, before any seat starts): every seat opens the files
    to lock them and to say who holds a GPU, so they are open to all (0666), and the folder to none but its owner
    (no seat adds or removes a GPU)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("gpu-*.lock"):
        if old.name[4:-5] not in devices:
            old.unlink()
    for path in [folder / QUEUE_LOCK, *(lock_path(folder, d) for d in devices)]:
        path.touch()
        path.chmod(0o666)
    folder.chmod(0o755)
    return folder


def devices(folder: Path) -> tuple[str, ...]:
    """The queue's GPUs, in their order (as CUDA_VISIBLE_DEVICES names them)."""
    found = [p.name[len("gpu-") : -len(".lock")] for p in Path(folder).glob("gpu-*.lock")]
    return tuple(sorted(found, key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d)))


def configured() -> str | None:
    """This seat's queue (QUEUE_ENV): a folder, or slurm:PARTITION; None where the room has none."""
    return os.environ.get(QUEUE_ENV, "").strip() or None


@dataclass
class Lease:
    devices: tuple[str, ...]
    waited_seconds: float
    _files: list[int] = field(default_factory=list, repr=False)
    launcher: tuple[str, ...] = ()  # the prefix that runs a command on the leased GPUs (Slurm's srun); () here
    source: str = "the room's queue"  # where the GPUs came from, as the learner reads it

    @property
    def visible(self) -> str:
        return ",".join(self.devices)

    @property
    def said(self) -> str:
        """What a learner reads when the GPUs come: which, from where, after how long."""
        return f"GPUs {self.visible} from {self.source} after {self.waited_seconds:.0f} s"

    def release(self) -> None:
        for fd in self._files:
            os.close(fd)  # closing the file releases its flock
        self._files.clear()


def on_leased(leased: Lease, command: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """`command` and `env` made to run on the leased GPUs: as a step of Slurm's allocation (Slurm sets
    CUDA_VISIBLE_DEVICES), or with CUDA_VISIBLE_DEVICES naming the queue's GPUs."""
    if leased.launcher:  # a step of the allocation: Slurm sets the devices; a seat job's own Slurm variables go
        return [*leased.launcher, *command], {
            k: v for k, v in slurm_gpus.clean_env(env).items() if k != "CUDA_VISIBLE_DEVICES"
        }
    return command, {**env, "CUDA_VISIBLE_DEVICES": leased.visible}


@contextlib.contextmanager
def lease(
    count: int, folder: Path | str | None = None, who: str | None = None, hold_seconds: float | None = None
) -> Iterator[Lease | None]:
    """`count` GPUs of the queue for the block, waiting in turn; None where there is no queue or it has fewer
    than `count` GPUs (the caller runs without them, and says so). `hold_seconds`: how long the block may hold
    them (a Slurm allocation's time limit, beyond which Slurm takes them back)."""
    folder = folder or configured()
    who = who or os.environ.get("LAB_SEAT") or os.environ.get("USER", "?")
    partition = slurm_gpus.partition_of(str(folder)) if folder is not None else None
    if partition is not None:
        with _slurm_lease(count, partition, who, hold_seconds) as leased:
            yield leased
        return
    pool = devices(Path(folder)) if folder is not None and Path(folder).is_dir() else ()
    if folder is not None and not pool:
        raise LabError(
            f"{QUEUE_ENV}={folder}: no GPU queue there (no gpu-*.lock files); the room makes it (lab room serve "
            f"with a plan from lab room plan --queue-gpus N), or unset {QUEUE_ENV}"
        )
    if count < 1 or count > len(pool):
        yield None
        return
    assert folder is not None
    taken = _take(Path(folder), pool, count, who)
    try:
        yield taken
    finally:
        taken.release()


@contextlib.contextmanager
def _slurm_lease(count: int, name: str, who: str, hold_seconds: float | None) -> Iterator[Lease | None]:
    partition = slurm_gpus.partition(name, f"{QUEUE_ENV}={slurm_gpus.PREFIX}{name}")
    if count < 1 or count > partition.gpus_per_node:
        yield None
        return
    with slurm_gpus.allocation(partition, count, who, hold_seconds) as (granted, waited):
        source = f"Slurm (job {granted.job_id} on {granted.node}, partition {name})"
        yield Lease(granted.devices, waited, launcher=granted.launcher(count), source=source)


def _take(folder: Path, pool: tuple[str, ...], count: int, who: str) -> Lease:
    started = time.monotonic()
    head = os.open(folder / QUEUE_LOCK, os.O_RDWR)
    try:
        fcntl.flock(head, fcntl.LOCK_EX)  # in line: the kernel wakes the next waiter when the head lets go
        while True:
            files: list[int] = []
            names: list[str] = []
            for device in pool:
                fd = os.open(lock_path(folder, device), os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                files.append(fd)
                names.append(device)
                if len(files) == count:
                    break
            if len(files) == count:
                break
            for fd in files:
                os.close(fd)
            time.sleep(POLL_SECONDS)
    finally:
        os.close(head)  # the next in line may look now
    waited = time.monotonic() - started
    note = json.dumps({"who": who, "pid": os.getpid(), "since": time.time()}) + "\n"
    for fd in files:
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
    return Lease(tuple(names), waited, files)


def holders(folder: Path) -> dict[str, dict | None]:
    """Each GPU of the queue: who holds it now ({"who", "pid", "since"}), None when free. Asked without taking
    anything: a GPU is held while its file is locked (a shared lock cannot be had)."""
    found: dict[str, dict | None] = {}
    for device in devices(folder):
        path = lock_path(folder, device)
        fd = os.open(path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    found[device] = json.loads(path.read_text() or "{}") or {"who": "?"}
                except ValueError:
                    found[device] = {"who": "?"}
            else:
                found[device] = None
        finally:
            os.close(fd)
    return found
