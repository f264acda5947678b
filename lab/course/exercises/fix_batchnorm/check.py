"""The `fix-batchnorm` exercise's checks: the learner's script run on 2 ranks, each rank training on shards of
different classes (as `lab pitfall batchnorm` does), each rank watched.

What each check reads from the traces:
- ends cleanly: the run's exit, or who waited in which collective when it hung;
- the same BatchNorm statistics on every rank: when the program returned, every running_mean and running_var
  buffer of the model DDP wrapped (each rank's `end` event), element by element across the ranks; the largest
  difference (lab.course.pitfalls.batchnorm.spread, the number the pitfall measures) must be at most TOLERANCE.
- the statistics of the global batch: those buffers against the ones every forward would have left had it seen
  every rank's batch together (global_batch.replay of each layer's `norm_batch` events), as SyncBatchNorm keeps
  them: within GLOBAL_TOLERANCE. DDP's broadcast_buffers=True makes the ranks agree on rank 0's shard's statistics,
  which this check tells apart (the half fix lesson 2 asks about); so is an average of each rank's finished
  statistics (its means are the global batch's, its variances are not).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from lab.course.exercises.fix_batchnorm.global_batch import Batch, distance, replay
from lab.course.exercises.grading import Run, ended, observed
from lab.course.pitfalls.batchnorm import spread
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
ARGUMENTS = ["--per-rank", "256", "--steps", "20", "--batch-size", "32", "--seed", "0"]
# The fixes leave the ranks' statistics identical (DDP's broadcast_buffers copies rank 0's bytes to every rank) or
# computed from the same all-reduced batch statistics (SyncBatchNorm), where a GPU's reduction order could move
# the last bits; the broken run differs by 0.1 and more. 1e-6 tells the two apart with room on both sides.
TOLERANCE = 1e-6
# float32 statistics (the learner's or SyncBatchNorm's) against a float64 replay: 20 forwards differ by about 1e-7;
# rank 0's shard's statistics are 0.1 and more away from the global batch's, an average of the ranks' variances 1+.
GLOBAL_TOLERANCE = 1e-4
RUNNING = ("running_mean", "running_var")
GLOBAL_FIX = (
    "Compute each training forward's statistics over every rank's batch: on GPUs convert the model with "
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP; on the CPU, where SyncBatchNorm does not run, "
    "a BatchNorm whose forward all-reduces the per-channel sum, sum of squares and count, then normalises with "
    "and updates its running statistics from those (torch.distributed.nn.functional.all_reduce carries the "
    "gradient back)"
)


def measure(file: Path, timeout_seconds: float) -> Run:
    return observed(file, WORLD, ARGUMENTS, timeout_seconds=timeout_seconds)


class Layer(NamedTuple):
    """One BatchNorm layer as the run left it: its starting buffers, momentum, each rank's forwards, its end."""

    start: dict[str, list[float]]
    momentum: float | None
    per_rank: list[list[Batch]]
    found: dict[str, list[float]]


def judge(run: Run) -> list[Check]:
    agreed = same_statistics(run)
    return [ended(run), agreed, global_statistics(run, agreed)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(measure(file, timeout_seconds))


def running_buffers(rank_models: list[dict]) -> dict[str, list[float]]:
    """{model index.buffer name: its values} for every running statistic of the wrapped models."""
    found = {}
    for m, model in enumerate(rank_models):
        for name, values in model.get("buffers", {}).items():
            if name.endswith(RUNNING) and "values" in values:
                found[name if m == 0 else f"model {m}: {name}"] = values["values"]
    return found


def same_statistics(run: Run) -> Check:
    name = "the same BatchNorm statistics on every rank"
    ended_ranks = [r for r in run.ranks if r.ended and r.models()]
    if not run.ranks or len(ended_ranks) < len(run.ranks):
        return Check(name, NOT_RUN, f"not measured: a rank never returned with a wrapped model; {run.how_it_ended()}")
    per_rank = [running_buffers(r.models()) for r in ended_ranks]
    if not per_rank[0]:
        return Check(name, HELD, "no running statistics at all (no BatchNorm layer): nothing to disagree on")
    if any(set(b) != set(per_rank[0]) for b in per_rank):
        return Check(name, FAILED, "the ranks' models hold different buffers", "every rank builds the same model")
    spreads = {buffer: spread([b[buffer] for b in per_rank]) for buffer in per_rank[0]}
    worst = max(spreads, key=lambda buffer: spreads[buffer])
    measured = (
        f"{len(spreads)} running-statistics buffers; the largest difference between ranks {spreads[worst]:.3g} "
        f"({worst}), tolerance {TOLERANCE:g}"
    )
    if spreads[worst] > TOLERANCE:
        return Check(
            name,
            FAILED,
            measured,
            "the running mean and variance are buffers: DDP averages gradients, not buffers, so each rank keeps "
            "the statistics of its own shard (broadcast_buffers=True, DDP's default, would make the ranks agree, on "
            "rank 0's shard's statistics only). " + GLOBAL_FIX,
        )
    return Check(name, HELD, measured)


def global_statistics(run: Run, agreed: Check) -> Check:
    name = "the statistics of the global batch"
    if agreed.verdict != HELD:
        why = agreed.detail if agreed.verdict == NOT_RUN else "the ranks' statistics differ (above)"
        return Check(name, NOT_RUN, why if why.startswith("not measured") else f"not measured: {why}")
    layers = run.ranks[0].of("norm")
    if not layers:
        return Check(name, HELD, "no running statistics at all (no BatchNorm layer): nothing to be global")
    models = run.ranks[0].models()
    worst, worst_layer, replayed = 0.0, "", []
    for layer in layers:
        key = (layer["model"], layer["name"])
        per_rank = [forwards(r.of("norm_batch"), key) for r in run.ranks]
        if len({len(f) for f in per_rank}) != 1:
            counts = ", ".join(f"rank {r}: {len(f)}" for r, f in enumerate(per_rank))
            return Check(name, NOT_RUN, f"not measured: the ranks ran different numbers of forwards ({counts})")
        start = {n: v["values"] for n, v in layer["start"].items() if "values" in v}
        found = ended_with(models, key)
        if found is None or "running_mean" not in start:
            return Check(name, NOT_RUN, f"not measured: the running statistics of {layer['name'] or 'the model'}")
        seen = Layer(start, layer["momentum"], per_rank, found)
        replayed.append(seen)
        expected = replay(start, seen.momentum, per_rank)
        gap = max(distance(found[k], expected[k]) for k in RUNNING)
        if gap >= worst:
            worst, worst_layer = gap, f"layer {layer['name']}" if layer["name"] else "the model"
    forwards_seen = len(replayed[0].per_rank[0])
    measured = (
        f"{len(layers)} BatchNorm layer(s), {forwards_seen} training forwards each: the running statistics differ "
        f"from the global batch's by up to {worst:.3g} ({worst_layer}), tolerance {GLOBAL_TOLERANCE:g}"
    )
    if worst <= GLOBAL_TOLERANCE:
        return Check(name, HELD, measured)
    return Check(name, FAILED, measured, why_not_global(replayed))


def forwards(events: list[dict], key: tuple[int, str]) -> list[Batch]:
    return [(e["n"], e["sum"], e["sumsq"]) for e in events if (e["model"], e["name"]) == key]


def ended_with(models: list[dict], key: tuple[int, str]) -> dict[str, list[float]] | None:
    model, layer = key
    buffers = models[model].get("buffers", {}) if model < len(models) else {}
    found = {k: buffers.get(f"{layer}.{k}" if layer else k, {}).get("values") for k in RUNNING}
    return None if None in found.values() else found


def why_not_global(layers: list[Layer]) -> str:
    """The hint: which half-fix the statistics match, replayed the same way, or the general fix."""
    copies = averages = True
    for start, momentum, per_rank, found in layers:
        rank0 = replay(start, momentum, per_rank[:1])
        copies &= all(distance(found[k], rank0[k]) <= GLOBAL_TOLERANCE for k in RUNNING)
        own = [replay(start, momentum, [f]) for f in per_rank]
        mean = [sum(c) / len(c) for c in zip(*(o["running_mean"] for o in own))]
        var = [sum(c) / len(c) for c in zip(*(o["running_var"] for o in own))]
        averages &= distance(found["running_mean"], mean) <= GLOBAL_TOLERANCE
        averages &= distance(found["running_var"], var) <= GLOBAL_TOLERANCE
    if copies:
        return (
            "every rank holds rank 0's own statistics (DDP's broadcast_buffers copies rank 0's buffers to every "
            "rank): they agree, but describe rank 0's shard, not the data. " + GLOBAL_FIX
        )
    if averages:
        return (
            "these are the average of each rank's own statistics: the means are the global batch's, the "
            "variances are not (a variance over every rank's batch also counts how far apart the ranks' means "
            "are). " + GLOBAL_FIX
        )
    return GLOBAL_FIX
