"""The `shard` exercise's checks: the learner's FSDP2 script and lab/course/exercises/shard/reference.py (the same
model,
data, seed and AdamW under DDP) each run on 2 ranks, watched.

What each check reads from the traces:
- runs on 2 ranks: the run's exit, or who waited in which collective when it hung;
- fully_shard on the model: the observer's `fully_shard` events on every rank, and among the modules it sharded
  (their parameters at exit, the `end` event) one that holds the parameters of all the others: the root;
- model state per rank below DDP's: the `step` events' state_bytes (parameters, gradients and optimizer state
  this rank holds, a DTensor's local shard only) at the last step, the largest over ranks, against the
  reference's: below MEMORY_RATIO of it, the ratio shown;
- DDP's loss curve: every rank's cross_entropy at every step against the reference rank's at the same step
  (each rank reads the same samples under either), within CURVE_TOLERANCE.

FSDP2 on CPU tensors needs torch > 2.6 (lab.compat.fsdp_runs_on_cpu): where it cannot run, the check says so
in one line instead of grading.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import compat
from lab.course.exercises import folder
from lab.course.exercises.grading import Run, ended, observed, reference_limit
from lab.run.cluster import cores
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
SAMPLES = 256
BATCH = 32  # global: 16 a rank, 8 steps an epoch
EPOCHS = 2
LR = 1e-3
# Each rank's shard of 4 copies of the weights (parameters, gradients, AdamW's two moments) is 1/2 of DDP's on 2
# ranks, plus padding to a multiple of the world size: measured 0.50. Anything not sharded stays at 1.00.
MEMORY_RATIO = 0.75
# Relative gap of any rank's loss at any step from DDP's. Measured 0 over the 16 steps on 2 CPU ranks (gloo: a
# sum of two gradients is the same in either order); NCCL's reduce-scatter may round in another order than its
# all-reduce, a few float32 ulps. A model that does not train together (an optimizer holding the parameters
# fully_shard replaced, a layer outside every unit) is 1e-1 off and more within a few steps.
CURVE_TOLERANCE = 1e-4


def arguments() -> list[str]:
    return [
        *("--samples", str(SAMPLES), "--batch-size", str(BATCH), "--epochs", str(EPOCHS)),
        *("--lr", str(LR), "--seed", "0"),
    ]


@dataclass
class Measured:
    run: Run
    reference: Run


def runs_here() -> str | None:
    """Why FSDP2 cannot run on this machine, or None."""
    if compat.fsdp_runs_on_cpu() or cores.gpu_count() >= WORLD:
        return None
    return f"this torch's FSDP2 needs GPUs (torch 2.6 on CPU tensors: lab.compat.fsdp_runs_on_cpu) and {WORLD} here"


def reference_run(timeout_seconds: float) -> Run:
    run = observed(
        folder("shard") / "reference.py",
        WORLD,
        arguments(),
        timeout_seconds=reference_limit(timeout_seconds),
        label="the DDP reference",
    )
    if not run.ok:
        raise RuntimeError(f"the reference run failed: {run.how_it_ended()}\n{run.output[-3000:]}")
    return run


def measure(file: Path, timeout_seconds: float, reference: Run | None = None) -> Measured:
    run = observed(file, WORLD, arguments(), timeout_seconds=timeout_seconds)
    return Measured(run, reference or reference_run(timeout_seconds))


def judge(m: Measured) -> list[Check]:
    return [ended(m.run, f"runs on {WORLD} ranks"), sharded(m.run), less_state(m), same_curve(m)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    why = runs_here()
    if why:
        return [Check("FSDP2 runs here", FAILED, why, "run the check on a machine with GPUs, or torch > 2.6")]
    return judge(measure(file, timeout_seconds))


def _not_measured(name: str, run: Run) -> Check | None:
    if run.ok and run.ranks and all(r.events for r in run.ranks):
        return None
    return Check(name, NOT_RUN, f"not measured: {run.how_it_ended()}")


def _holds_the_others(models: list[dict[str, Any]]) -> bool:
    """Whether one sharded module's parameters are as many as all the others' together (the root's are)."""
    counts = sorted(len(m.get("parameters", {})) for m in models)
    return bool(counts) and counts[-1] >= sum(counts[:-1])


def sharded(run: Run) -> Check:
    name = "fully_shard on the model"
    missing = _not_measured(name, run)
    if missing:
        return missing
    without = [r.rank for r in run.ranks if not r.has("fully_shard")]
    if without:
        in_ddp = all(r.has("ddp") for r in run.ranks)
        return Check(
            name,
            FAILED,
            f"no fully_shard on rank {', '.join(map(str, without))}" + (" (the model is in DDP)" if in_ddp else ""),
            "from torch.distributed.fsdp import fully_shard; call it on each Linear, then on the whole model, in "
            "place of DDP, and build the optimizer after",
        )
    events = run.ranks[0].of("fully_shard")
    units = ", ".join(e["module"] for e in events)
    if not _holds_the_others(run.ranks[0].models()):
        return Check(
            name,
            FAILED,
            f"fully_shard on {units}, each a unit, and none on the model that holds them",
            "call fully_shard(model) on the root after its layers: it takes the parameters no unit holds and is "
            "the one FSDP root that runs the units' all-gathers and reduce-scatters in order (each unit otherwise "
            "acts as a root of its own)",
        )
    return Check(name, HELD, f"on every rank: {len(events)} units ({units}), the root last")


def _state_bytes(run: Run) -> int | None:
    """The largest over ranks of the model state held at the last optimizer step."""
    last = [r.of("step")[-1]["state_bytes"] for r in run.ranks if r.of("step")]
    return max(last) if len(last) == len(run.ranks) else None


def less_state(m: Measured) -> Check:
    name = "model state per rank below DDP's"
    missing = _not_measured(name, m.run)
    if missing:
        return missing
    ours, theirs = _state_bytes(m.run), _state_bytes(m.reference)
    if ours is None or theirs is None:
        return Check(name, FAILED, "no optimizer step on some rank", "keep the training loop: step every batch")
    ratio = ours / theirs
    measured = (
        f"{ours / 1024:.0f} KiB of parameters, gradients and AdamW state per rank vs DDP's {theirs / 1024:.0f} KiB "
        f"({ratio:.2f}x, below {MEMORY_RATIO:.2f}x)"
    )
    if ratio >= MEMORY_RATIO:
        return Check(
            name,
            FAILED,
            measured.replace("below", "not below"),
            f"each rank still holds the whole model: under fully_shard on all {WORLD} ranks (the default mesh, "
            "every rank one shard) each keeps 1/N of the parameters, gradients and optimizer state; DDP, or a "
            "mesh that replicates, keeps all of them",
        )
    return Check(name, HELD, measured)


def same_curve(m: Measured) -> Check:
    name = "DDP's loss curve"
    missing = _not_measured(name, m.run)
    if missing:
        return missing
    worst, where = 0.0, ""
    for ours, theirs in zip(m.run.ranks, m.reference.ranks):
        if len(ours.losses) != len(theirs.losses):
            return Check(
                name,
                FAILED,
                f"rank {ours.rank}: {len(ours.losses)} losses, DDP's {len(theirs.losses)}",
                "keep the training loop, its batches and epochs, as they are",
            )
        for step, (a, b) in enumerate(zip(ours.losses, theirs.losses), start=1):
            gap = abs(a - b) / abs(b)
            if gap > worst:
                worst, where = gap, f"rank {ours.rank} step {step}: {a:.6f} vs {b:.6f}"
    steps = len(m.reference.ranks[0].losses)
    measured = f"{steps} steps on {WORLD} ranks, the largest gap {worst:.1e}" + (f" ({where})" if where else "")
    if worst > CURVE_TOLERANCE:
        return Check(
            name,
            FAILED,
            measured + f", more than {CURVE_TOLERANCE:g}",
            "build the optimizer after fully_shard: it replaces every parameter with its sharded DTensor, and an "
            "optimizer made before holds the old ones, which no longer train; every parameter must be in a "
            "unit, or its gradient is never reduced across ranks",
        )
    return Check(name, HELD, measured + f", within {CURVE_TOLERANCE:g}")
