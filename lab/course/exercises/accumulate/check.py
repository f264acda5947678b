"""The `accumulate` exercise's checks: the learner's DDP script run on 2 ranks with K micro-batches per optimizer
step, and lab/course/exercises/accumulate/reference.py in one process on the large batch (micro-batch x K x ranks), each
watched.

What each check reads from the traces:
- runs on 2 ranks: the run's exit, or who waited in which collective when it hung;
- one all-reduce per optimizer step: DDP's bucket all-reduces (its comm hook, counted by the observer) between
  one optimizer step and the next, on every rank, against the buckets one backward all-reduces: K times as many
  is an all-reduce per micro-batch (no no_sync);
- the large batch's weights: the optimizer steps taken, and every final weight of rank 0's model (the observer's
  `end` event) against the reference's, element by element, within WEIGHT_TOLERANCE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lab.course.exercises import folder
from lab.course.exercises.grading import Run, ended, observed, reference_limit
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
SAMPLES = 256
MICRO_BATCH = 8  # samples per rank per forward and backward
ACCUMULATE = 4  # K: 16 micro-batches a rank an epoch, 4 optimizer steps
EPOCHS = 2
LR = 0.1
# The largest difference a right solution leaves in any weight after 8 steps: float32 sums of the same
# gradients in another order (K micro-batch means on 2 ranks vs one mean), measured 1e-7 or less on CPU; far below
# the loss left undivided (K times the step: weights 1e-1 apart) or steps taken per micro-batch.
WEIGHT_TOLERANCE = 1e-5


def learner_arguments() -> list[str]:
    return [
        *("--samples", str(SAMPLES), "--micro-batch", str(MICRO_BATCH), "--accumulate", str(ACCUMULATE)),
        *("--epochs", str(EPOCHS), "--lr", str(LR), "--seed", "0"),
    ]


def reference_arguments() -> list[str]:
    large = MICRO_BATCH * ACCUMULATE * WORLD
    return [
        *("--samples", str(SAMPLES), "--batch-size", str(large), "--epochs", str(EPOCHS)),
        *("--lr", str(LR), "--seed", "0"),
    ]


@dataclass
class Measured:
    run: Run
    reference: Run


def reference_run(timeout_seconds: float) -> Run:
    run = observed(
        folder("accumulate") / "reference.py",
        None,
        reference_arguments(),
        timeout_seconds=reference_limit(timeout_seconds),
        label="the large-batch reference",
    )
    if not run.ok:
        raise RuntimeError(f"the reference run failed: {run.how_it_ended()}\n{run.output[-3000:]}")
    return run


def measure(file: Path, timeout_seconds: float, reference: Run | None = None) -> Measured:
    run = observed(file, WORLD, learner_arguments(), timeout_seconds=timeout_seconds)
    return Measured(run, reference or reference_run(timeout_seconds))


def judge(m: Measured) -> list[Check]:
    return [ended(m.run, f"runs on {WORLD} ranks"), one_allreduce_per_step(m.run), large_batch_weights(m)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(measure(file, timeout_seconds))


def _not_measured(name: str, run: Run) -> Check | None:
    if run.ok and run.ranks and all(r.events for r in run.ranks):
        return None
    return Check(name, NOT_RUN, f"not measured: {run.how_it_ended()}")


def one_allreduce_per_step(run: Run) -> Check:
    name = "one all-reduce per optimizer step"
    missing = _not_measured(name, run)
    if missing:
        return missing
    for r in run.ranks:
        if not r.has("ddp"):
            return Check(
                name,
                FAILED,
                f"rank {r.rank} trained without DistributedDataParallel",
                "keep the model in DDP: accumulation changes when it all-reduces, not whether",
            )
        refused = r.of("ddp_hook_refused")
        if refused:
            return Check(name, NOT_RUN, f"not measured: DDP refused the counting hook ({refused[0]['reason']})")
    rank = run.ranks[0]
    per_step, buckets = rank.allreduces_per_step(), rank.buckets()
    if not per_step:
        return Check(name, FAILED, "no optimizer step", "step the optimizer after every K-th micro-batch")
    micro = ACCUMULATE
    counts = sorted(set(per_step))
    if counts == [buckets] and buckets:
        return Check(
            name,
            HELD,
            f"{len(per_step)} steps, each {buckets} all-reduce{'s' if buckets > 1 else ''} "
            f"({buckets} bucket{'s' if buckets > 1 else ''}), not one per micro-batch ({micro} a step)",
        )
    most = max(per_step)
    if buckets and most >= micro * buckets:
        return Check(
            name,
            FAILED,
            f"{most} bucket all-reduces per optimizer step for {buckets} bucket{'s' if buckets > 1 else ''}: "
            f"one per micro-batch ({micro} a step)",
            "DDP all-reduces in every backward: run every micro-batch but the last inside `with model.no_sync():` "
            "and it keeps their gradients local, adding up, and all-reduces the sum once in the last backward",
        )
    if not buckets or min(per_step) == 0:
        return Check(
            name,
            FAILED,
            f"all-reduces per optimizer step: {', '.join(map(str, counts))} ({buckets} buckets)",
            "a step without an all-reduce leaves each rank its own gradient: the last micro-batch's backward "
            "must run outside no_sync",
        )
    return Check(
        name,
        FAILED,
        f"all-reduces per optimizer step: {', '.join(map(str, counts))}, for {buckets} buckets",
        "no_sync around every micro-batch but the last of each optimizer step, and the step after the last",
    )


def _weights(run: Run) -> dict[str, list[float]]:
    models = run.ranks[0].models() if run.ranks else []
    if not models or "parameters" not in models[0]:
        return {}
    return {name: p.get("values", []) for name, p in models[0]["parameters"].items()}


def large_batch_weights(m: Measured) -> Check:
    name = "the large batch's weights"
    missing = _not_measured(name, m.run)
    if missing:
        return missing
    steps, expected_steps = m.run.ranks[0].steps, m.reference.ranks[0].steps
    if steps != expected_steps:
        return Check(
            name,
            FAILED,
            f"{steps} optimizer steps, the large batch {expected_steps}",
            f"step the optimizer once per {ACCUMULATE} micro-batches (--accumulate), after the last of them",
        )
    ours, theirs = _weights(m.run), _weights(m.reference)
    if set(ours) != set(theirs) or not ours:
        return Check(
            name,
            FAILED,
            f"rank 0's model has parameters {sorted(ours)[:4]}, the reference's {sorted(theirs)[:4]}",
            "keep the starter's model (build_model) inside DDP",
        )
    largest, where = 0.0, ""
    count = 0
    for key, values in theirs.items():
        for a, b in zip(ours[key], values):
            count += 1
            if abs(a - b) > largest:
                largest, where = abs(a - b), key
    measured = (
        f"{steps} steps; {count} weights, the largest difference from the large batch's {largest:.1e} ({where}), "
        f"within {WEIGHT_TOLERANCE:g}"
    )
    if largest > WEIGHT_TOLERANCE:
        return Check(
            name,
            FAILED,
            measured.replace("within", "more than"),
            f"each micro-batch's loss is its own mean: divide it by K (--accumulate, {ACCUMULATE} here) before "
            "backward, so the K gradients add up to the large batch's mean, not K times it",
        )
    return Check(name, HELD, measured.replace(f" ({where})", ""))
