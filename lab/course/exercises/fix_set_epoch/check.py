"""The `fix-set-epoch` exercise's checks: the learner's DDP loop run on 2 ranks for a few epochs, each rank watched.

What each check reads from the traces (never from what the script prints):
- ends cleanly: the run's exit, or who waited in which collective when it hung;
- a new order each epoch: the dataset indices each rank's DataLoader fetched, per epoch, and the share of the
  epochs after the first that repeat epoch 0's order on that rank (lab.course.pitfalls.set_epoch.repeat_share, the
  number `lab pitfall set-epoch` measures): 0% holds, anything above fails. The sampler's epoch at each
  DataLoader iteration is shown beside it, since that is what set_epoch changes.
"""

from __future__ import annotations

from pathlib import Path

from lab.course.exercises.grading import Run, ended, observed
from lab.course.pitfalls.set_epoch import repeat_share
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
SAMPLES = 96  # 48 a rank: 6 steps of 8 an epoch
EPOCHS = 3  # two later epochs to compare with epoch 0
ARGUMENTS = ["--samples", str(SAMPLES), "--epochs", str(EPOCHS), "--batch-size", "8", "--seed", "0"]


def measure(file: Path, timeout_seconds: float) -> Run:
    return observed(file, WORLD, ARGUMENTS, timeout_seconds=timeout_seconds)


def judge(run: Run) -> list[Check]:
    return [ended(run), new_order_each_epoch(run)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(measure(file, timeout_seconds))


def new_order_each_epoch(run: Run) -> Check:
    name = "a new order each epoch"
    orders = [r.epochs for r in run.ranks]
    if not orders or any(len(epochs) < 2 for epochs in orders):
        read = ", ".join(f"rank {r.rank} {len(r.epochs)}" for r in run.ranks)
        return Check(name, NOT_RUN, f"not measured: epochs read {read} (2 or more each needed); {run.how_it_ended()}")
    later = sum(len(epochs) - 1 for epochs in orders)
    repeats = round(sum(repeat_share(epochs) * (len(epochs) - 1) for epochs in orders))
    sampler_epochs = [e.get("sampler_epoch") for e in run.ranks[0].of("epoch")]
    measured = (
        f"{repeats} of {later} later epochs ({repeats / later:.0%}) repeated epoch 0's order on their rank, "
        f"over {len(orders)} ranks; rank 0's sampler epoch at each epoch: {', '.join(map(str, sampler_epochs))}"
    )
    if repeats:
        return Check(
            name,
            FAILED,
            measured,
            "DistributedSampler shuffles with seed + its epoch, and its epoch stays 0 until you set it: call "
            "sampler.set_epoch(epoch) at the top of every epoch, on every rank, before iterating the DataLoader",
        )
    return Check(name, HELD, measured)
