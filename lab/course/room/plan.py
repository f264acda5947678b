"""The room's plan: which GPUs, cores and memory each seat gets, checked before the learners arrive.

    lab room plan --gpus 8 --seats 4          # 4 seats of 2 GPUs: the table below, and runs/room/plan.json
    lab room plan --devices MIG-a,MIG-b,...   # one MIG instance (or GPU) per seat, from the host's list
    lab room plan --gpus 8 --mig-per-gpu 3    # 24 seats of one MIG slice each, planned before the slices exist

Every GPU belongs to one seat (a learner who starts DDP "on every GPU" then takes only their own); cores are
pinned, a disjoint set per seat, where there are at least as many cores as seats, else shared; memory is the
host's less the hub's share, split evenly, and refused when a seat's share cannot hold lesson 1.

How a seat runs the lessons follows lab.course.teaching.lesson.plan(): with 2 or more GPUs every lesson runs on them at
GPU sizes (NCCL, one rank per GPU); with one GPU or a MIG instance a multi-rank part cannot have a device per
rank (and NCCL does not run DDP across MIG instances of one job), so the lessons run the CPU way (2 gloo
processes, the device hidden), which the table says.

More learners than GPUs take MIG slices (a GPU split into 2, 3, 4 or 7 isolated instances): planned from anywhere
with --mig-per-gpu (the table names each slice by its GPU, gpu0/mig1, and says how to make them), served on the
host once the slices exist (this host's plan then hands out their MIG UUIDs, read from `nvidia-smi -L`).

>>> host = Host(devices=tuple("01234567"), cores=tuple(range(32)), memory_bytes=256 * GIB)
>>> room = make_plan(host, seats=4)
>>> [(s.name, s.cuda_visible_devices, len(s.cpus), s.memory_bytes // GIB) for s in room.seats]
[('seat1', '0,1', 8, 57), ('seat2', '2,3', 8, 57), ('seat3', '4,5', 8, 57), ('seat4', '6,7', 8, 57)]
>>> make_plan(host, seats=12)
Traceback (most recent call last):
lab.errors.LabError: 12 seats on 8 GPUs: each GPU belongs to one seat; split each GPU into 2 MIG slices
(--mig-per-gpu 2: 16 slices of 3g.40gb on an H100; docs/workshop-reference.md#more-learners-than-gpus-mig-slices),
or seat them in pairs (--seats 6, 1 GPU a seat)
>>> [s.devices for s in make_plan(Host(planned_slices(2, 3), tuple(range(32)), 256 * GIB)).seats][:4]
[('gpu0/mig1',), ('gpu0/mig2',), ('gpu0/mig3',), ('gpu1/mig1',)]
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab import atomic
from lab.course.room.host import GIB, Host, this_host
from lab.course.room.mig import (  # noqa: F401  (EXAMPLE_LISTING, MIG_SPLITS: the tests' and docs' names here too)
    EXAMPLE_LISTING,
    MIG_SPLITS,
    PLANNED_SLICE,
    is_slice,
    mig_commands,
    planned_slices,
    too_many_seats,
)
from lab.errors import LabError

# Host memory one seat needs for lesson 1 the CPU way: its JupyterLab server and kernel, the baseline (one
# process), then DDP (torchrun and 2 gloo workers). Measured as the peak of the seat's processes' summed PSS
# (scripts/room-bench.py, 2-core x86_64, torch 2.14.1): 2.19 GiB for a seat alone, 1.83-1.99 GiB each with 3, 5
# or 7 seats at once (shared pages split between them). 3 GiB keeps room for a second notebook left open.
SEAT_MEMORY_FLOOR_BYTES = 3 * GIB
# Per GPU of a seat, the host memory of a rank that drives it (its CUDA context, pinned buffers, the data set on
# the host before it is copied over). Not measured here (no GPU): a rank of the lab on an H100 is expected to hold
# 2-4 GiB of host memory; the floor takes the top of that.
GPU_HOST_BYTES = 4 * GIB
# A seat is a hub user and a system user (useradd's portable names), so only lower-case letters and digits.
SEAT_NAME = re.compile(r"^[a-z][a-z0-9]{0,30}$")
DEFAULT_PLAN = Path("runs") / "room" / "plan.json"
# GPU-seconds one seat's exercise check holds the queue's GPUs for, for the plan's expected wait (--check-seconds).
# Assumed, not measured: no GPU here. On 2 CPU cores a 2-rank check's runs take 20-45 s (docs/exercises.md); on
# GPUs the learner's scripts are smaller than their start-up, so the same order is expected. Measure it on the day
# (the check prints its wait and its runs' seconds) and plan again with the figure.
CHECK_SECONDS = 25.0
QUEUE_RANKS = 2  # the ranks (GPUs) of an exercise check's multi-rank run: its lease
INSTRUCTOR = "instructor"  # the hub's admin (RoomSettings.admin), and its seat's name with --instructor-seat


@dataclass(frozen=True)
class Seat:
    """One learner's share of the host."""

    name: str
    devices: tuple[str, ...] = ()  # the seat's CUDA_VISIBLE_DEVICES
    cpus: tuple[int, ...] = ()  # cores pinned to the seat; () where seats share every core
    cpu_share: float = 1.0  # cores' worth the seat may use (a container's cpu_limit)
    memory_bytes: int = 0  # its memory limit

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(self.devices)

    @property
    def threads(self) -> int:
        """OMP_NUM_THREADS for the seat's processes where its cores are shared (pinned seats split their own)."""
        return max(1, int(self.cpu_share))

    @property
    def mig(self) -> bool:
        return any(is_slice(d) for d in self.devices)

    def lessons(self) -> str:
        """How the seven lessons run on this seat (lab.course.teaching.lesson.plan's rule, said for the table).

        >>> Seat("a", ("0", "1")).lessons()
        '1-7 on its 2 GPUs (NCCL, GPU sizes)'
        >>> Seat("a", ("MIG-x",)).lessons()
        '1-7 the CPU way (2 gloo processes): NCCL cannot run DDP across MIG instances'
        """
        if self.mig:
            return "1-7 the CPU way (2 gloo processes): NCCL cannot run DDP across MIG instances"
        if len(self.devices) >= 2:
            return f"1-7 on its {len(self.devices)} GPUs (NCCL, GPU sizes)"
        if self.devices:
            return "1-7 the CPU way (2 gloo processes): DDP needs a GPU per rank, and this seat has one"
        return "1-7 the CPU way (2 gloo processes)"


@dataclass(frozen=True)
class RoomPlan:
    host: Host
    seats: tuple[Seat, ...]
    notes: tuple[str, ...] = field(default=())  # what the instructor should know: unused GPUs, shared cores
    queue: tuple[str, ...] = ()  # whole GPUs no seat owns: every seat's multi-rank runs lease them in turn
    check_seconds: float = CHECK_SECONDS  # a check's GPU time, for the queue's expected wait

    def seat(self, name: str) -> Seat:
        for seat in self.seats:
            if seat.name == name:
                return seat
        raise LabError(f"no seat named {name!r} in the room's plan; its seats: {', '.join(self.names)}")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.seats]

    def leases(self, seat: Seat) -> bool:
        """The seat's multi-rank runs lease the queue's GPUs: too few whole GPUs of its own, and a queue to lease."""
        return (seat.mig or len(seat.devices) < QUEUE_RANKS) and len(self.queue) >= QUEUE_RANKS

    def lessons(self, seat: Seat) -> str:
        """Its own GPUs, else each run on GPUs leased from the queue, else the CPU way (lesson.plan's rule)."""
        if self.leases(seat):
            return f"1-6 on {QUEUE_RANKS} GPUs leased from the queue a run (NCCL, GPU sizes), 7 the CPU way"
        return seat.lessons()

    def multi_rank(self, seat: Seat) -> str:
        """Where the seat's multi-rank exercise checks run.

        >>> room = RoomPlan(Host(("MIG-a", "MIG-b", "6", "7"), (0,), GIB), (Seat("a", ("MIG-a",)),), queue=("6", "7"))
        >>> room.multi_rank(room.seats[0]), room.multi_rank(Seat("b", ("0", "1"))), room.lessons(room.seats[0])[:30]
        ('on 2 GPUs leased from the queue (6,7)', 'on its 2 GPUs', '1-6 on 2 GPUs leased from the ')
        """
        if self.leases(seat):
            return f"on {QUEUE_RANKS} GPUs leased from the queue ({','.join(self.queue)})"
        if len(seat.devices) >= QUEUE_RANKS and not seat.mig:
            return f"on its {len(seat.devices)} GPUs"
        return "the CPU way (2 gloo processes): no queue of whole GPUs (--queue-gpus)"


# ----------------------------------------------------------------------------- making and checking a plan


def make_plan(
    host: Host,
    seats: int | None = None,
    gpus_per_seat: int | None = None,
    prefix: str = "seat",
    queue_gpus: int = 0,
    check_seconds: float = CHECK_SECONDS,
    instructor: str = "",
) -> RoomPlan:
    """Seats with disjoint GPUs and cores and an even share of memory; LabError when the host cannot hold them.

    Defaults: on a GPU host, 2 GPUs a seat (NCCL's smallest DDP), as many seats as that gives; on a CPU host,
    a seat per 2 cores (a lesson's 2 gloo processes, a core each). `queue_gpus`: the host's last whole GPUs kept
    out of the seats, for every seat's multi-rank runs (lab.run.cluster.gpu_queue). `instructor`: one more seat,
    of that name (the hub's admin), with no GPU of its own: a server for the instructor to project.

    >>> cpu = Host((), (0, 1), 24 * GIB)
    >>> room = make_plan(cpu, seats=3)
    >>> [(s.name, s.cpus, round(s.cpu_share, 2), s.memory_bytes // 2**20) for s in room.seats]
    [('seat1', (), 0.67, 7372), ('seat2', (), 0.67, 7372), ('seat3', (), 0.67, 7372)]
    >>> make_plan(cpu, seats=8)
    Traceback (most recent call last):
    lab.errors.LabError: 8 seats do not fit in 24.0 GiB of memory: 21.6 GiB after the hub's share holds at most 7
    seats of 3.0 GiB (lesson 1 the CPU way); use --seats 7 or fewer
    """
    if not SEAT_NAME.match(prefix + "1"):
        raise LabError(
            f"--prefix {prefix!r}: a seat's name is a system user name: lower-case letters and digits, "
            f"starting with a letter (e.g. seat)"
        )
    devices, notes = host.devices, []
    if seats is not None and seats < 1:
        raise LabError(f"--seats {seats}: a room needs at least one seat")
    queue = _queue(host, queue_gpus)
    devices = tuple(d for d in devices if d not in queue)
    if devices:
        if gpus_per_seat is None:
            # a MIG instance is one device to CUDA and NCCL alike: one a seat
            mig = any(is_slice(d) for d in devices)
            gpus_per_seat = max(1, len(devices) // seats) if seats else 1 if mig else min(2, len(devices))
        if seats is None:
            seats = len(devices) // gpus_per_seat
        if seats > len(devices):
            raise LabError(too_many_seats(seats, devices))
        if seats * gpus_per_seat > len(devices):
            raise LabError(
                f"{seats} seats of {gpus_per_seat} GPUs need {seats * gpus_per_seat}; this host has "
                f"{len(devices)}: at most {len(devices) // gpus_per_seat} seats of {gpus_per_seat}"
            )
        spare = devices[seats * gpus_per_seat :]
        if spare:
            noun = "MIG slice" if any(is_slice(d) for d in devices) else "GPU"
            notes.append(
                f"{_plural(len(spare), noun)} ({','.join(spare)}) left to no seat: {len(devices)} do not "
                f"split evenly into {_plural(seats, 'seat')} of {gpus_per_seat}"
            )
    else:
        if gpus_per_seat:
            raise LabError(
                f"--gpus-per-seat {gpus_per_seat}: this host has no GPU (give --gpus N to plan for a "
                f"GPU server from here)"
            )
        gpus_per_seat = 0
        seats = seats or max(1, len(host.cores) // 2)
    learners, seats = seats, seats + (1 if instructor else 0)  # the instructor's seat shares cores and memory
    _check_memory(host, seats, gpus_per_seat)
    memory = (host.memory_bytes - host.reserve_bytes) // seats
    cores = host.cores
    pinned = len(cores) // seats if len(cores) >= seats else 0
    if not pinned:
        notes.append(
            f"{seats} seats share {len(cores)} cores ({len(cores) / seats:.2f} each): lessons run slower "
            f"while seats run at once"
        )
    made = []
    for i in range(seats):
        mine = cores[i * pinned : (i + 1) * pinned] if pinned else ()
        made.append(
            Seat(
                f"{prefix}{i + 1}" if i < learners else instructor,
                tuple(devices[i * gpus_per_seat : (i + 1) * gpus_per_seat]) if i < learners else (),
                mine,
                float(pinned) if pinned else len(cores) / seats,
                memory,
            )
        )
    return RoomPlan(host, tuple(made), tuple(notes), queue, check_seconds)


def _queue(host: Host, count: int) -> tuple[str, ...]:
    """The host's last `count` whole GPUs (a MIG-split GPU cannot be leased whole)."""
    if count < 0:
        raise LabError(f"--queue-gpus {count}: give a number of whole GPUs, 0 for no queue")
    whole = [d for d in host.devices if not is_slice(d)]
    if count > len(whole):
        raise LabError(
            f"--queue-gpus {count}: this host has {len(whole)} whole GPU(s) (a MIG-split GPU cannot be leased whole); "
            f"with --mig-per-gpu the queue's GPUs are left unsplit: --gpus 8 --mig-per-gpu 3 --queue-gpus 2"
        )
    if count == 1:
        raise LabError(f"--queue-gpus 1: a multi-rank run leases {QUEUE_RANKS} GPUs; keep 2 or more, or 0")
    return tuple(whole[len(whole) - count :]) if count else ()


def require_devices(plan: RoomPlan, source: str) -> RoomPlan:
    """A plan a room can serve: no slice that is only planned (a seat cannot be given a slice that does not exist)."""
    for seat in plan.seats:
        planned = [d for d in seat.devices if PLANNED_SLICE.match(d)]
        if planned:
            raise LabError(
                f"{source}: {seat.name}'s device {planned[0]} is a MIG slice planned, not made: make the slices "
                f"(lab room plan prints the nvidia-smi commands) and plan on the server with lab room plan "
                f"--seats {len(plan.seats)}, which hands out their MIG UUIDs"
            )
    return plan


def seat_floor_bytes(gpus_per_seat: int) -> int:
    return SEAT_MEMORY_FLOOR_BYTES + gpus_per_seat * GPU_HOST_BYTES


def _check_memory(host: Host, seats: int, gpus_per_seat: int) -> None:
    usable = host.memory_bytes - host.reserve_bytes
    floor = seat_floor_bytes(gpus_per_seat)
    if usable // seats >= floor:
        return
    fits = max(0, usable // floor)
    what = (
        f"{gpus_per_seat} GPU{'s' if gpus_per_seat > 1 else ''} and lesson 1"
        if gpus_per_seat
        else "lesson 1 the CPU way"
    )
    if not fits:
        raise LabError(
            f"this host's {host.memory_bytes / GIB:.1f} GiB cannot hold one seat of {floor / GIB:.1f} GiB ({what})"
        )
    raise LabError(
        f"{seats} seats do not fit in {host.memory_bytes / GIB:.1f} GiB of memory: {usable / GIB:.1f} "
        f"GiB after the hub's share holds at most {_plural(fits, 'seat')} of {floor / GIB:.1f} GiB "
        f"({what}); use --seats {fits} or fewer"
    )


def check(plan: RoomPlan, source: str) -> RoomPlan:
    """A plan read from a file (perhaps edited): names valid and distinct, no GPU or core in two seats, the memory
    limits within the host's. LabError naming the file, the seats and what is wrong."""
    seen_names: set[str] = set()
    owner: dict[tuple[str, str], str] = {}
    for seat in plan.seats:
        if not SEAT_NAME.match(seat.name):
            raise LabError(
                f"{source}: seat {seat.name!r}: a seat's name is a system user name: lower-case letters "
                f"and digits, starting with a letter"
            )
        if seat.name in seen_names:
            raise LabError(f"{source}: two seats are named {seat.name!r}; give each seat its own name")
        seen_names.add(seat.name)
        for kind, things in (("GPU", seat.devices), ("core", tuple(map(str, seat.cpus)))):
            for thing in things:
                other = owner.setdefault((kind, thing), seat.name)
                if other != seat.name:
                    raise LabError(
                        f"{source}: seats {other} and {seat.name} both have {kind} {thing}; each {kind} "
                        f"belongs to one seat"
                    )
    if not plan.seats:
        raise LabError(f"{source}: the plan has no seats; make one with lab room plan --seats N")
    for device in plan.queue:
        if ("GPU", device) in owner:
            raise LabError(
                f"{source}: GPU {device} is in the queue and in seat {owner['GPU', device]}; a queue's GPU belongs to "
                f"no seat"
            )
    total = sum(s.memory_bytes for s in plan.seats)
    usable = plan.host.memory_bytes - plan.host.reserve_bytes
    if total > usable:
        raise LabError(
            f"{source}: the seats' memory limits add up to {total / GIB:.1f} GiB, over the "
            f"{usable / GIB:.1f} GiB the host has after the hub's share; lower them or seat fewer"
        )
    return plan


# ----------------------------------------------------------------------------- the file


def save(plan: RoomPlan, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(asdict(plan), indent=2) + "\n")
    return path


def load(path: Path) -> RoomPlan:
    """A plan file written by save() (and perhaps edited): checked as check() does."""
    try:
        raw = json.loads(Path(path).read_text())
        host = Host(
            tuple(map(str, raw["host"]["devices"])),
            tuple(map(int, raw["host"]["cores"])),
            int(raw["host"]["memory_bytes"]),
        )
        seats = tuple(
            Seat(
                str(s["name"]),
                tuple(map(str, s.get("devices", ()))),
                tuple(map(int, s.get("cpus", ()))),
                float(s.get("cpu_share", 1.0)),
                int(s["memory_bytes"]),
            )
            for s in raw["seats"]
        )
        plan = RoomPlan(
            host,
            seats,
            tuple(raw.get("notes", ())),
            tuple(map(str, raw.get("queue", ()))),
            float(raw.get("check_seconds", CHECK_SECONDS)),
        )
    except FileNotFoundError:
        raise LabError(f"{path}: no room plan there; make one with lab room plan --seats N --json {path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(f"{path}: not a room plan ({type(exc).__name__}: {exc}); make one with lab room plan") from None
    return check(plan, str(path))


def _plural(count: int, thing: str) -> str:
    return f"{count} {thing}{'' if count == 1 else 's'}"


def from_args(args: argparse.Namespace) -> RoomPlan:
    """The plan `lab room plan` and `lab room serve` share: --plan FILE, else one made for this host (or the host
    --gpus/--devices, --cores and --memory describe)."""
    if getattr(args, "plan", None):
        return load(Path(args.plan))
    queue_gpus = getattr(args, "queue_gpus", 0) or 0
    host = this_host(
        args.gpus, args.devices, args.cores, args.memory, getattr(args, "mig_per_gpu", None), whole_gpus=queue_gpus
    )
    check_seconds = getattr(args, "check_seconds", None) or CHECK_SECONDS
    instructor = INSTRUCTOR if getattr(args, "instructor_seat", False) else ""
    return make_plan(host, args.seats, args.gpus_per_seat, args.prefix, queue_gpus, check_seconds, instructor)
