"""`lab room plan`'s table: each seat's GPUs, cores, memory, where its lessons and its exercise checks run, the queue's
expected wait, and the commands that make planned MIG slices; then the plan written for `lab room serve --plan`."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.course.room.host import GIB, core_list
from lab.course.room.mig import PLANNED_SLICE, is_slice, mig_commands
from lab.course.room.plan import CHECK_SECONDS, INSTRUCTOR, QUEUE_RANKS, RoomPlan, from_args, save


def queue_waits(seats: int, gpus: int, seconds: float, ranks: int = QUEUE_RANKS) -> tuple[float, float]:
    """(longest, mean) wait when `seats` seats ask the queue's `gpus` GPUs for `ranks` each at once, each holding
    them `seconds`: gpus // ranks checks run side by side, the rest wait their turn.

    >>> queue_waits(24, 2, 25.0)
    (575.0, 287.5)
    >>> queue_waits(16, 4, 25.0)
    (175.0, 87.5)
    """
    side_by_side = max(1, gpus // ranks)
    waits = [(i // side_by_side) * seconds for i in range(seats)]
    return max(waits, default=0.0), sum(waits) / max(1, seats)


def table(plan: RoomPlan) -> str:
    """The table an instructor checks before the learners arrive (Markdown, readable as text)."""
    rows = [
        "| seat | GPUs (CUDA_VISIBLE_DEVICES) | CPU cores | memory limit | the lessons | its exercise checks |",
        "|---|---|---|---:|---|---|",
    ]
    for s in plan.seats:
        cores = core_list(s.cpus) if s.cpus else f"shared ({s.cpu_share:.2f})"
        rows.append(
            f"| {s.name} | {s.cuda_visible_devices or 'none'} | {cores} | "
            f"{s.memory_bytes / GIB:.1f} GiB | {plan.lessons(s)} | {plan.multi_rank(s)} |"
        )
    host = plan.host
    learners = sum(s.name != INSTRUCTOR for s in plan.seats)
    replan = "".join(  # the options that planned this room again, once its slices have their UUIDs
        [
            f" --queue-gpus {len(plan.queue)}" if plan.queue else "",
            f" --check-seconds {plan.check_seconds:g}" if plan.check_seconds != CHECK_SECONDS else "",
            " --instructor-seat" if learners < len(plan.seats) else "",
        ]
    )
    rows.append("")
    if plan.queue:
        users = [s for s in plan.seats if plan.leases(s)]
        longest, mean = queue_waits(len(users), len(plan.queue), plan.check_seconds)
        rows.append(
            f"queue: GPUs {','.join(plan.queue)}, whole, no seat's: each exercise check's multi-rank run leases "
            f"{QUEUE_RANKS} of them for its run; {len(users)} seats checking at once: the last waits ~{longest:.0f} s "
            f"(mean {mean:.0f} s), at {plan.check_seconds:g} s of GPUs a check (--check-seconds, assumed: the "
            f"check prints its wait and seconds; plan again with the day's figure); the lessons' runs lease the "
            f"same GPUs, one run at a time, and add their own time (not measured here: no GPU)"
        )
    planned = {m.group(1) for m in map(PLANNED_SLICE.match, host.devices) if m}
    whole = [d for d in host.devices if not is_slice(d)]
    if planned:
        devices = f"{len(planned)} GPUs as {len(host.devices) - len(whole)} MIG slices"
        devices += f" and {len(whole)} whole" if whole else ""
    elif any(is_slice(d) for d in host.devices):
        devices = f"{len(host.devices) - len(whole)} MIG slices" + (f" and {len(whole)} whole GPUs" if whole else "")
    else:
        devices = f"{len(host.devices)} GPUs"
    rows.append(
        f"host: {devices}, {len(host.cores)} cores, {host.memory_bytes / GIB:.1f} GiB "
        f"({host.reserve_bytes / GIB:.1f} GiB kept for the hub and the system)"
    )
    rows += [f"note: {n}" for n in plan.notes]
    commands = mig_commands(plan.host.devices, learners, replan)
    if commands:
        rows += ["", "the MIG slices are planned, not made: on the server, as root, before the room arrives:"]
        rows += [f"    {c}" for c in commands]
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    """`lab room plan`: the table, and the plan written for `lab room serve --plan`."""
    plan = from_args(args)
    print(table(plan))
    print(f"\nplan: {save(plan, Path(args.json))} (lab room serve --plan {args.json})")
    return 0
