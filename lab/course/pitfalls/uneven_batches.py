"""uneven-batches: ranks with different batch counts in a plain DDP loop, and three ways to even them.

Broken: rank 0 holds one more batch than the others (its shard has a few more samples, as when a data
set is split by file). In its last step rank 0's backward starts DDP's gradient all_reduce, which no
other rank joins: they have left the loop. It waits until the process group's timeout (TIMEOUT_SECONDS
here; by default 30 minutes on gloo, 10 on NCCL), then fails. The ranks that ran out stay alive meanwhile,
so rank 0 sees a timeout, as in a real job, not a closed connection.

Fixed, each measured: `Join([ddp])` (the ranks that finish shadow the all_reduce with zeros until the last
one is done), and DistributedSampler over the whole data set, which gives every rank the same count,
either by repeating samples (drop_last=False: padding) or by dropping the tail (drop_last=True).

>>> sampler_counts(samples=69, world_size=2, drop_last=False)   # 35 each: one sample served twice
{'per_rank': 35, 'repeated': 1, 'dropped': 0}
>>> sampler_counts(samples=69, world_size=2, drop_last=True)    # 34 each: one sample never served
{'per_rank': 34, 'repeated': 0, 'dropped': 1}
>>> shard_bounds(world_size=3)                                  # rank 0 has 5 samples more: a 5th batch
[(0, 37), (37, 69), (69, 101)]
"""

from __future__ import annotations

import math
import re
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from lab.course.pitfalls import module_name, workers
from lab.run.cluster import jobs

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch
    from torch.distributed import ProcessGroup
    from torch.nn.parallel import DistributedDataParallel

    from lab.run.cluster.dist import DistContext

PITFALL = "uneven-batches"
BATCH = 8
FIRST_SHARD = 37  # rank 0: 4 full batches and one of 5
OTHER_SHARD = 32  # every other rank: 4 full batches
TIMEOUT_SECONDS = 5  # the process groups of the lesson: long enough for a step, short enough to wait for
LEARNING_RATE = 0.05
FIXES = ("join", "pad", "drop")
COLUMNS = {
    "broken": "broken: plain DDP loop",
    "join": "fixed: Join([ddp])",
    "pad": "fixed: DistributedSampler drop_last=False",
    "drop": "fixed: DistributedSampler drop_last=True",
}

WHY = (
    "DDP all-reduces the gradients in every backward, and a collective completes only when every rank of the "
    "group joins it. A rank with one more batch waits in that all_reduce for ranks that have left the loop, "
    "until the process-group timeout (30 minutes by default on gloo, 10 on NCCL), and the job dies. "
    "Join([ddp]) lets the ranks that finish shadow the collectives with zeros until the last rank is done; "
    "DistributedSampler gives every rank the same count, by repeating a few samples (drop_last=False) or "
    "dropping the tail (drop_last=True)."
)


def shard_bounds(world_size: int) -> list[tuple[int, int]]:
    """Each rank's [start, end) of the data set in the broken loop and under Join."""
    sizes = [FIRST_SHARD] + [OTHER_SHARD] * (world_size - 1)
    starts = [sum(sizes[:r]) for r in range(world_size)]
    return [(start, start + size) for start, size in zip(starts, sizes)]


def sampler_counts(samples: int, world_size: int, drop_last: bool) -> dict[str, int]:
    """What DistributedSampler does with `samples` over `world_size` ranks (its arithmetic, for the doctest;
    the measurement counts what the real sampler served)."""
    per_rank = samples // world_size if drop_last else math.ceil(samples / world_size)
    served = per_rank * world_size
    return {"per_rank": per_rank, "repeated": max(0, served - samples), "dropped": max(0, samples - served)}


def timeout_message(text: str) -> str:
    """gloo's own sentence out of the error DDP raises (it wraps it in a callback's traceback).

    >>> timeout_message("Got the following error when running the callback: RuntimeError: [gloo/tcp/"
    ...                 "unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete At: ...")
    'RuntimeError: Timed out waiting 5000ms for recv operation to complete (gloo, unbound_buffer.cc:78)'
    """
    found = re.search(r"\[([^\]]*gloo[^\]]*?)\] (Timed out waiting \d+ms for \w+ operation to complete)", text)
    if found is None:
        return " ".join(text.split())[:240]
    return f"RuntimeError: {found.group(2)} (gloo, {found.group(1).rsplit('/', 1)[-1]})"


def measure(world_size: int) -> dict[str, Any]:
    # gloo on the CPU whatever the host: there a timed-out collective raises in the rank that waited and can be
    # reported; NCCL's watchdog would abort the process instead.
    reports = workers.run_job(module_name(PITFALL), world_size, "cpu")
    broken = broken_side(reports)
    fixes = {fix: fixed_side(reports, fix) for fix in FIXES}
    samples = shard_bounds(world_size)[-1][1]
    evened = all(fix["completed"] and len(set(fix["batches_per_rank"])) == 1 for fix in (fixes["pad"], fixes["drop"]))
    demonstrated = (
        broken["timed_out"]
        and broken["waiting_rank"] == 0
        and evened
        and fixes["join"]["completed"]
        and fixes["join"]["weights_equal"]
        and fixes["pad"]["samples_repeated"] > 0
        and fixes["drop"]["samples_dropped"] > 0
    )

    def batches(side: dict[str, Any]) -> str:
        return " / ".join(map(str, side["batches_per_rank"]))

    def outcome(side: dict[str, Any]) -> str:
        if side.get("timed_out"):
            return f"hung: rank {side['waiting_rank']} timed out after {side['waited_seconds']:.1f} s"
        return f"completed in {side['seconds']:.2f} s" if side["completed"] else f"failed: {side.get('error')}"

    order = [broken, *fixes.values()]
    table = {
        "columns": [COLUMNS["broken"], *(COLUMNS[f] for f in FIXES)],
        "rows": [
            ["batches per rank", *(batches(s) for s in order)],
            ["optimizer steps per rank", *(" / ".join(map(str, s["steps_per_rank"])) for s in order)],
            ["outcome", *(outcome(s) for s in order)],
            [
                f"samples repeated / dropped (of {samples})",
                *(f"{s['samples_repeated']} / {s['samples_dropped']}" for s in order),
            ],
            [
                "weights equal across ranks at the end",
                "-",
                *("yes" if s["weights_equal"] else "NO" for s in fixes.values()),
            ],
        ],
    }
    notes = [broken["story"]]
    if broken["timed_out"]:
        notes.append(f"rank {broken['waiting_rank']}'s error: {broken['error']}")
    summary = (
        f"plain loop: rank {broken['waiting_rank']} waited {broken['waited_seconds']:.1f} s in "
        f"{broken['collective']} at step {broken['waiting_step']} and timed out; Join completed with "
        f"{batches(fixes['join'])} steps; the sampler evened the counts by repeating "
        f"{fixes['pad']['samples_repeated']} or dropping {fixes['drop']['samples_dropped']} sample(s)"
        if broken["timed_out"]
        else "the plain loop did not time out: " + broken["story"]
    )
    if not demonstrated:
        summary = "expected a timeout in the plain loop and completion with each fix; measured " + summary
    return {
        "pitfall": PITFALL,
        "world_size": world_size,
        "device": "cpu (gloo)",
        "broken": broken,
        "fixed": fixes,
        "demonstrated": demonstrated,
        "summary": summary,
        "why": WHY,
        "table": table,
        "notes": notes,
        "timeout_seconds": TIMEOUT_SECONDS,
    }


def broken_side(reports: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = [r["broken"] for r in reports]
    waiting = [r for r in ranks if r["timed_out"]]
    ran_out = [r for r in ranks if not r["timed_out"]]
    side = {
        "batches_per_rank": [r["batches"] for r in ranks],
        "steps_per_rank": [r["steps"] for r in ranks],
        "timed_out": bool(waiting),
        "completed": not waiting,
        "samples_repeated": 0,
        "samples_dropped": 0,
        "waiting_rank": None,
        "waited_seconds": None,
        "collective": None,
        "waiting_step": None,
        "error": None,
    }
    out = ", ".join(f"rank {r['rank']} ran out of batches after {r['steps']} steps" for r in ran_out)
    if waiting:
        w = waiting[0]
        side.update(
            waiting_rank=w["rank"],
            waited_seconds=w["waited_seconds"],
            collective=w["collective"],
            waiting_step=w["steps"] + 1,
            error=w["error"],
        )
        side["story"] = (
            f"{out}; rank {w['rank']}, in step {w['steps'] + 1} of {w['batches']}, waited "
            f"{w['waited_seconds']:.1f} s in {w['collective']} for them and gave up "
            f"(timeout {TIMEOUT_SECONDS} s)"
        )
    else:
        side["story"] = f"{out}; no rank waited: the symptom did not show"
    return side


def fixed_side(reports: list[dict[str, Any]], fix: str) -> dict[str, Any]:
    ranks = [r[fix] for r in reports]
    served = [i for r in ranks for i in r["indices"]]
    samples = reports[0]["samples"]
    return {
        "batches_per_rank": [r["batches"] for r in ranks],
        "steps_per_rank": [r["steps"] for r in ranks],
        "completed": all(r["completed"] for r in ranks),
        "error": next((r["error"] for r in ranks if r["error"]), None),
        "seconds": max(r["seconds"] for r in ranks),
        "samples_repeated": len(served) - len(set(served)),
        "samples_dropped": samples - len(set(served)),
        "weights_equal": len({tuple(r["weights"]) for r in ranks}) == 1,
    }


# ----------------------------------------------------------------------------- the torchrun worker


def worker(argv: list[str]) -> None:
    from lab.run.cluster import dist

    job = jobs.this_job(argv)
    with workers.process_group("cpu") as ctx:
        result = {"rank": ctx.global_rank, "samples": shard_bounds(ctx.world_size)[-1][1], "broken": plain_loop(ctx)}
        # The ranks that ran out wait here, on the default group, while rank 0 waits in the lesson's group: a
        # different group, so rank 0's all_reduce still finds no partner and times out, and nobody has exited.
        dist.barrier(ctx)
        for fix in FIXES:
            result[fix] = fixed_loop(ctx, fix)
        job.report(ctx.global_rank, result)


def _group(seconds: float = TIMEOUT_SECONDS) -> ProcessGroup:
    """A fresh gloo group with the lesson's short timeout: one that times out is left behind, not reused."""
    import datetime

    import torch.distributed as tdist

    group = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
    assert isinstance(group, tdist.ProcessGroup)  # every rank is in it (no ranks= given)
    return group


def _ddp(group: ProcessGroup) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from lab.course.pitfalls import toy

    ddp = DistributedDataParallel(toy.mlp("none", seed=0), process_group=group)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)


def _step(ddp: DistributedDataParallel, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    from torch.nn.functional import cross_entropy

    optimizer.zero_grad(set_to_none=True)
    cross_entropy(ddp(x), y).backward()
    optimizer.step()


def plain_loop(ctx: DistContext) -> dict[str, Any]:
    """Every batch of this rank's uneven shard through DDP; a timed-out collective is caught and described."""
    from lab.course.pitfalls import toy
    from lab.run.cluster.dist import is_collective_timeout

    start, end = shard_bounds(ctx.world_size)[ctx.global_rank]
    x, y = toy.blobs(shard_bounds(ctx.world_size)[-1][1], seed=1)
    batches = list(zip(x[start:end].split(BATCH), y[start:end].split(BATCH)))
    ddp, optimizer = _ddp(_group())
    posted: dict[str, Any] = {}

    # Unannotated on purpose: DDP refuses a hook whose annotations are not dist.GradBucket and Future[Tensor]
    # themselves, and this module's annotations are strings (from __future__ import annotations)
    def recording_allreduce(group, bucket):  # type: ignore[no-untyped-def]
        # DDP's own all_reduce (the default hook), noting when this rank posted it: the wait is measured from there
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        posted.update(at=time.monotonic(), elements=bucket.buffer().numel(), bucket=bucket.index())
        return allreduce_hook(group, bucket)

    ddp.register_comm_hook(ddp.process_group, recording_allreduce)
    result: dict[str, Any] = {"rank": ctx.global_rank, "batches": len(batches), "steps": 0, "timed_out": False}
    for bx, by in batches:
        try:
            _step(ddp, optimizer, bx, by)
        except RuntimeError as exc:
            if not is_collective_timeout(exc):
                raise
            result.update(
                timed_out=True,
                waited_seconds=round(time.monotonic() - posted["at"], 2),
                collective=f"DDP's gradient all_reduce (bucket {posted['bucket']}, {posted['elements']} floats)",
                error=timeout_message(str(exc)),
                error_full=" ".join(str(exc).split())[:600],
            )
            break
        result["steps"] += 1
    return result


def fixed_loop(ctx: DistContext, fix: str) -> dict[str, Any]:
    """The same training with one fix; what each rank ran and saw."""
    import torch
    from torch.distributed.algorithms.join import Join
    from torch.utils.data import Dataset, DistributedSampler

    from lab.course.pitfalls import toy

    samples = shard_bounds(ctx.world_size)[-1][1]
    x, y = toy.blobs(samples, seed=1)
    if fix == "join":
        start, end = shard_bounds(ctx.world_size)[ctx.global_rank]
        indices = list(range(start, end))
    else:
        sampler: DistributedSampler[int] = DistributedSampler(
            cast(Dataset[int], range(samples)),  # the sampler reads only len(): the indices stand for the data
            num_replicas=ctx.world_size,
            rank=ctx.global_rank,
            shuffle=True,
            seed=0,
            drop_last=(fix == "drop"),
        )
        indices = list(sampler)
    batches = torch.tensor(indices).split(BATCH)
    ddp, optimizer = _ddp(_group())
    result: dict[str, Any] = {
        "batches": len(batches),
        "steps": 0,
        "indices": indices,
        "completed": False,
        "error": None,
    }
    started = time.monotonic()
    try:
        with Join([ddp]) if fix == "join" else _nothing():
            for batch in batches:
                _step(ddp, optimizer, x[batch], y[batch])
                result["steps"] += 1
        result["completed"] = True
    except RuntimeError as exc:  # a fix that does not work times out too: measured, not a crash
        result["error"] = " ".join(str(exc).split())[:240]
    result["seconds"] = round(time.monotonic() - started, 3)
    result["weights"] = torch.cat([p.detach().flatten() for p in ddp.module.parameters()]).tolist()
    return result


def _nothing() -> AbstractContextManager[None]:
    import contextlib

    return contextlib.nullcontext()


if __name__ == "__main__":
    worker(sys.argv[1:])
