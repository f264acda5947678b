"""The `fix-batchnorm` exercise's checks: the learner's script run on 2 ranks, each rank training on shards of
different classes (as `lab pitfall batchnorm` does), each rank watched.

What each check reads from the traces:
- ends cleanly: the run's exit, or who waited in which collective when it hung;
- the same BatchNorm statistics on every rank: when the program returned, every running_mean and running_var
  buffer of the model DDP wrapped (each rank's `end` event), element by element across the ranks; the largest
  difference (lab.course.pitfalls.batchnorm.spread, the number the pitfall measures) must be at most TOLERANCE.
"""

from __future__ import annotations

from pathlib import Path

from lab.course.exercises.grading import Run, ended, observed
from lab.course.pitfalls.batchnorm import spread
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
ARGUMENTS = ["--per-rank", "256", "--steps", "20", "--batch-size", "32", "--seed", "0"]
# The fixes leave the ranks' statistics identical (DDP's broadcast_buffers copies rank 0's bytes to every rank) or
# computed from the same all-reduced batch statistics (SyncBatchNorm), where a GPU's reduction order could move
# the last bits; the broken run differs by 0.1 and more. 1e-6 tells the two apart with room on both sides.
TOLERANCE = 1e-6
RUNNING = ("running_mean", "running_var")


def measure(file: Path, timeout_seconds: float) -> Run:
    return observed(file, WORLD, ARGUMENTS, timeout_seconds=timeout_seconds)


def judge(run: Run) -> list[Check]:
    return [ended(run), same_statistics(run)]


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
            "the statistics of its own shard. Leave DDP's broadcast_buffers at True, its default (rank 0's "
            "statistics copied to every rank at each forward), and on GPUs convert the model with "
            "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP (statistics over every rank's batch)",
        )
    return Check(name, HELD, measured)
