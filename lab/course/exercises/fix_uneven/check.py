"""The `fix-uneven` exercise's checks: the learner's script run on 2 ranks, rank 0's slice one batch longer than
rank 1's (as `lab pitfall uneven-batches` does), each rank watched, the run stopped at the timeout if it hangs.

What each check reads from the traces:
- ends cleanly: the run's exit; when it hangs, who waited in which collective (DDP's bucket all-reduce, counted
  as ddp_allreduce, or the learner's own call with its line) and who was elsewhere, from each rank's last
  collective entered and never left (lab.course.exercises.grading.hang);
- every rank ends with the same weights: each wrapped model's parameters when the program returned, element by
  element across the ranks. The ranks' optimizer steps are counted and shown, but equal counts are not asked
  for: under Join the rank with more batches takes more steps, the others answering its all-reduces with zeros,
  and every rank still ends with one set of weights. What must not happen is a step one rank took on gradients
  the others never averaged (a "fix" that skips DDP's all-reduce for the extra batch): its weights then differ.
"""

from __future__ import annotations

from pathlib import Path

from lab.course.exercises import grading
from lab.course.exercises.grading import Run, observed
from lab.course.pitfalls.batchnorm import spread
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
# 32 samples a rank, rank 0 5 more: 4 batches of 8 on rank 1, and a fifth of 5 on rank 0
ARGUMENTS = ["--per-rank", "32", "--extra", "5", "--batch-size", "8", "--seed", "0"]
# DDP gives every rank the same averaged gradient, bit for bit, and Join ends with a broadcast of the last rank's
# weights: synchronized ranks agree exactly. One unsynchronized step moves weights by about the learning rate.
TOLERANCE = 1e-6


def measure(file: Path, timeout_seconds: float) -> Run:
    return observed(file, WORLD, ARGUMENTS, timeout_seconds=timeout_seconds)


def judge(run: Run) -> list[Check]:
    return [ends_cleanly(run), same_weights(run)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(measure(file, timeout_seconds))


def ends_cleanly(run: Run) -> Check:
    name = "ends cleanly"
    if run.ok:
        return Check(name, HELD, run.how_it_ended())
    in_ddp = [r.rank for r in run.ranks if (w := r.waiting()) and w["op"] == "ddp_allreduce"]
    if run.still_moving:  # correct or not, it was not seen to hang: the limit was too short for this machine
        hint = grading.SLOW_HINT
    elif in_ddp:
        hint = (
            f"rank {in_ddp[0]} has a batch more than another rank, and in it DDP's backward all-reduces the "
            "gradients with ranks that have left the loop: wrap the loop in "
            "torch.distributed.algorithms.join.Join([model]) (a rank out of batches answers the others' "
            "all-reduces until all are done), or give every rank the same number of batches"
        )
    elif run.timed_out:
        hint = "a rank waited in a collective the others never called: every rank must call the same ones, in order"
    else:
        grading.show_output(run)
        hint = grading.OUTPUT_HINT
    return Check(name, FAILED, run.how_it_ended(), hint)


def _parameters(models: list[dict]) -> list[float]:
    return [v for model in models for p in model.get("parameters", {}).values() for v in p.get("values", [])]


def same_weights(run: Run) -> Check:
    name = "every rank ends with the same weights"
    if not run.ranks or not all(r.ended and r.models() for r in run.ranks):
        return Check(name, NOT_RUN, f"not measured: a rank never returned with a wrapped model; {run.how_it_ended()}")
    steps = " / ".join(str(r.steps) for r in run.ranks)
    weights = [_parameters(r.models()) for r in run.ranks]
    if not weights[0] or any(len(w) != len(weights[0]) for w in weights):
        return Check(name, NOT_RUN, f"not measured: the ranks' models differ in size; optimizer steps {steps}")
    largest = spread(weights)
    measured = (
        f"optimizer steps per rank {steps}; the largest difference of a weight between ranks {largest:.3g} "
        f"(tolerance {TOLERANCE:g})"
    )
    if largest > TOLERANCE:
        return Check(
            name,
            FAILED,
            measured,
            "a rank stepped on gradients the other ranks never averaged with theirs (no_sync, or a step outside "
            "DDP), so the ranks now hold different models: every step must go through DDP's all-reduce on every "
            "rank; Join([model]) lets a rank that ran out of batches take part in the others' all-reduces",
        )
    return Check(name, HELD, measured)
