"""The `convert` exercise's checks: the learner's DDP script run on 2 and on 3 ranks (an odd world catches hard-coded
halves), a resume, and the unchanged starter alone as the reference, each rank watched.

What each check reads from the traces (never from what the script claims):
- ends cleanly: each run's exit, or who waited in which collective when it hung;
- DDP: DistributedDataParallel wrapped the model on every rank, and nn.DataParallel did not;
- disjoint shards: the dataset indices each rank's DataLoader fetched, per epoch;
- a new order each epoch: those indices, epoch 0 against epoch 1, per rank;
- the curve: the optimizer steps per epoch and the loss (each rank's cross_entropy, averaged) against the reference's;
- the checkpoint: which ranks called torch.save on it, and the keys of the model's state dict it saved;
- the resume: every rank loaded it, ran only the epochs left, and started from the trained loss;
- the report: rank 0's printed loss at each step against the mean of the ranks' measured losses.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lab.course.exercises import folder
from lab.course.exercises.grading import Run, each_world, ended, observed, reference_limit
from lab.course.exercises.trace import Rank
from lab.verdict import FAILED, HELD, NOT_RUN, Check

SAMPLES = 192  # divides by 2 and by 3: every rank an equal share, no padding
BATCH = 24  # global: 12 a rank on 2, 8 on 3
EPOCHS = 3
WORLDS = (2, 3)
CURVE_TOLERANCE = 0.25  # relative gap of the last epoch's mean loss; a share of one order is not the same batches
PRINT_TOLERANCE = 2e-4  # the script prints 6 decimals; a rank's own loss differs from the mean by far more


def arguments(epochs: int, checkpoint: Path) -> list[str]:
    return [
        *("--synthetic", str(SAMPLES), "--batch-size", str(BATCH), "--epochs", str(epochs)),
        *("--lr", "0.05", "--seed", "0", "--checkpoint", str(checkpoint)),
    ]


@dataclass
class Measured:
    """The runs the checks read: the reference alone, the learner's file per world size, its resume."""

    reference: Run
    runs: dict[int, Run]
    resumed: Run | None  # None: not asked for (tests), or the 2-rank run left no checkpoint
    resume_asked: bool
    work: Path  # where the checkpoints were (gone by the time the checks read the traces)
    skipped: list[Check] = field(default_factory=list)  # world sizes not started after one hung


def reference_run(work: Path, timeout_seconds: float) -> Run:
    """The unchanged starter on one device: the curve and the checkpoint's keys the learner's must match."""
    run = observed(
        folder("convert") / "starter.py",
        None,
        arguments(EPOCHS, work / "reference.pt"),
        timeout_seconds=reference_limit(timeout_seconds),
        label="the single-device reference",
    )
    if not run.ok:
        raise RuntimeError(f"the reference run failed: {run.how_it_ended()}\n{run.output[-3000:]}")
    return run


def measure(
    file: Path,
    timeout_seconds: float,
    worlds: tuple[int, ...] = WORLDS,
    resume: bool = True,
    reference: Run | None = None,
) -> Measured:
    """Run the learner's file on each world size, then resume its 2-rank run (tests measure less: one world)."""
    with tempfile.TemporaryDirectory(prefix="lab-convert-") as tmp:
        work = Path(tmp)
        reference = reference or reference_run(work, timeout_seconds)
        runs, skipped = each_world(
            worlds, lambda n: observed(file, n, arguments(EPOCHS, work / f"ck-{n}.pt"), timeout_seconds=timeout_seconds)
        )
        resumed = None
        if resume and 2 in runs and runs[2].ok and (work / "ck-2.pt").exists():
            resumed = observed(
                file,
                2,
                arguments(EPOCHS + 1, work / "ck-2.pt"),
                timeout_seconds=timeout_seconds,
                label="the resume on 2 ranks",
            )
    return Measured(reference, runs, resumed, resume and 2 in runs, work, skipped)


def judge(m: Measured) -> list[Check]:
    """Every check the measured runs allow (all of them after `measure`'s defaults)."""
    two = m.runs[min(m.runs)]
    checks = [
        *(ended(m.runs[n], f"runs on {n} ranks") for n in m.runs),
        *m.skipped,
        wraps_in_ddp(m.runs),
        disjoint_shards(m.runs),
        new_order_each_epoch(two),
        same_curve(two, m.reference),
        rank0_writes(m.runs, m.work),
        plain_checkpoint(two, m.reference),
    ]
    if m.resume_asked:
        checks.append(resume_continues(m.runs[2], m.resumed, m.work / "ck-2.pt"))
    return [*checks, mean_reported(two)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(measure(file, timeout_seconds))


def _not_measured(name: str, run: Run) -> Check | None:
    if run.ranks and all(r.events for r in run.ranks) and run.ok:
        return None
    return Check(name, NOT_RUN, f"not measured: {run.how_it_ended()}")


def wraps_in_ddp(runs: dict[int, Run]) -> Check:
    name = "the model in DistributedDataParallel"
    ranks = [r for run in runs.values() for r in run.ranks]
    if any(r.has("dataparallel") for r in ranks):
        return Check(
            name,
            FAILED,
            "nn.DataParallel wrapped the model",
            "DataParallel is one process scattering each batch over the GPUs it sees; under torchrun each rank is "
            "its own process, so the ranks never exchange gradients. Use DistributedDataParallel "
            "(torch.nn.parallel.DistributedDataParallel) after init_process_group.",
        )
    wrapped = [r.rank for r in ranks if r.has("ddp")]
    if len(wrapped) == len(ranks) and ranks:
        return Check(name, HELD, f"every rank wrapped its model ({len(ranks)} ranks over {len(runs)} runs)")
    return Check(
        name,
        FAILED,
        f"DDP wrapped the model on {len(wrapped)} of {len(ranks)} ranks",
        "without DDP each rank trains its own copy on its own samples: wrap the model in "
        "DistributedDataParallel on every rank (device_ids=[local_rank] on a GPU)",
    )


WHOLE_DATA_SET = (
    "every rank reads the whole data set: give the DataLoader a DistributedSampler (shuffle=False on the loader "
    "itself, the sampler shuffles)"
)


def disjoint_shards(runs: dict[int, Run]) -> Check:
    name = "each rank its own share of every epoch"
    measured = []
    for n, run in runs.items():
        # A run that crashed still shows what its ranks read in the epochs they finished (the last may be cut short)
        epochs = [r.epochs if run.ok else r.epochs[:-1] for r in run.ranks]
        if not all(epochs):
            alone = [i for i, ep in enumerate(epochs) if ep and len(set(ep[0])) == SAMPLES]
            if alone:  # one rank read everything in an epoch while another finished none: no share was taken
                return Check(
                    name,
                    FAILED,
                    f"{n} ranks: rank {alone[0]} read all {SAMPLES} samples in an epoch, another rank finished none",
                    WHOLE_DATA_SET,
                )
            return Check(name, NOT_RUN, f"not measured: no rank finished an epoch ({run.how_it_ended()})")
        for e in range(min(map(len, epochs))):
            shares = [set(ep[e]) for ep in epochs]
            union = set().union(*shares)
            shared = sum(len(s) for s in shares) - len(union)
            if shared or len(union) != SAMPLES:
                whole = all(len(s) == SAMPLES for s in shares)
                hint = (
                    WHOLE_DATA_SET
                    if whole
                    else "the ranks' shares overlap or leave samples out: let DistributedSampler split one order "
                    "(it reads the rank and the world size from the process group)"
                )
                sizes = "+".join(str(len(s)) for s in shares)
                return Check(
                    name,
                    FAILED,
                    f"{n} ranks, epoch {e}: {sizes} samples read, {shared} read twice, "
                    f"{len(union)} of {SAMPLES} covered",
                    hint,
                )
        sizes = "+".join(str(len(ep[0])) for ep in epochs)
        measured.append(f"{n} ranks: {sizes} of {SAMPLES}, none shared")
    return Check(name, HELD, "; ".join(measured))


def new_order_each_epoch(run: Run) -> Check:
    name = "a new order each epoch"
    missing = _not_measured(name, run)
    if missing:
        return missing
    repeated = [r.rank for r in run.ranks if len(r.epochs) > 1 and r.epochs[1] == r.epochs[0]]
    if repeated:
        return Check(
            name,
            FAILED,
            f"on {run.world_size} ranks, epoch 1 repeated epoch 0's order on rank(s) {', '.join(map(str, repeated))}",
            "DistributedSampler seeds its shuffle with seed + epoch: call train_data.sampler.set_epoch(epoch) at "
            "the top of every epoch",
        )
    return Check(name, HELD, f"on {run.world_size} ranks every rank read epoch 1 in a different order than epoch 0")


def _steps_per_epoch(rank: Rank) -> int:
    return rank.steps // max(len(rank.epochs), 1)


def mean_losses(run: Run) -> list[float]:
    """The global batch's loss at each step: the mean over ranks of what each computed."""
    per_rank = [r.losses for r in run.ranks]
    steps = min(map(len, per_rank)) if per_rank else 0
    return [statistics.fmean(losses[i] for losses in per_rank) for i in range(steps)]


def same_curve(run: Run, reference: Run) -> Check:
    name = "the single-device curve at the same global batch"
    missing = _not_measured(name, run)
    if missing:
        return missing
    expected_steps = _steps_per_epoch(reference.ranks[0])
    steps = _steps_per_epoch(run.ranks[0])
    if steps != expected_steps:
        return Check(
            name,
            FAILED,
            f"{steps} optimizer steps per epoch on {run.world_size} ranks, {expected_steps} on one device",
            "--batch-size is the global batch: each rank's DataLoader takes batch_size // world_size",
        )
    ours, theirs = mean_losses(run), reference.ranks[0].losses
    if not expected_steps or not theirs:
        return Check(name, NOT_RUN, "not measured: the reference took no step", "")
    if len(ours) < len(theirs):
        return Check(name, FAILED, f"the ranks computed {len(ours)} losses, one device {len(theirs)}", "")
    last = slice(len(theirs) - expected_steps, len(theirs))
    a, b = statistics.fmean(ours[last]), statistics.fmean(theirs[last])
    gap = abs(a - b) / b
    measured = (
        f"{steps} steps an epoch as on one device; last epoch's mean loss {a:.3f} on {run.world_size} ranks vs {b:.3f} "
        f"({gap:.0%} apart, within {CURVE_TOLERANCE:.0%})"
    )
    if gap > CURVE_TOLERANCE:
        return Check(
            name,
            FAILED,
            measured.replace("within", "more than"),
            "the ranks do not train one model on one global batch: check that DDP wraps the model every rank "
            "steps, and that the learning rate and batch are the reference's",
        )
    return Check(name, HELD, measured)


def _saves(rank: Rank, path: Path) -> list[dict]:
    names = {str(path), str(path) + ".tmp"}
    return [e for e in rank.of("save") if e["path"] in names or Path(e["path"]).parent == path.parent]


def rank0_writes(runs: dict[int, Run], work: Path) -> Check:
    name = "rank 0 alone writes the checkpoint"
    counts = []
    for n, run in runs.items():
        if not all(r.events for r in run.ranks):  # a save is a save, even in a run that crashed after it
            return Check(name, NOT_RUN, f"not measured: {run.how_it_ended()}")
        per_rank = [len(_saves(r, work / f"ck-{n}.pt")) for r in run.ranks]
        counts.append(f"{n} ranks: " + ", ".join(f"rank {i} {c}" for i, c in enumerate(per_rank)))
        if per_rank[0] == 0:
            return Check(name, FAILED, f"{n} ranks: rank 0 saved nothing", "save the checkpoint from rank 0")
        cut_short = [i for i, (r, c) in enumerate(zip(run.ranks, per_rank)) if i and not c and not r.ended]
        if cut_short:  # a rank that never got as far as a save tells nothing of who writes
            return Check(name, NOT_RUN, f"not measured: {n} ranks: rank {cut_short[0]} ended before any save")
        steps = [r.steps for r in run.ranks]
        if len(set(steps)) > 1:  # a rank that trained fewer epochs (it found another's finished checkpoint first)
            return Check(
                name,
                NOT_RUN,
                f"not measured: {n} ranks took {', '.join(map(str, steps))} steps: they did not run the same epochs",
                "every rank trains the same epochs in step: DDP, one rank writing, a barrier before any rank reads",
            )
        if any(per_rank[1:]):
            return Check(
                name,
                FAILED,
                "torch.save calls " + counts[-1],
                "every rank holds the same weights, so every rank saving writes N copies of one file, racing: "
                "save only where dist.get_rank() == 0, then dist.barrier() so no rank reads it early",
            )
    return Check(name, HELD, "torch.save calls " + "; ".join(counts))


def plain_checkpoint(run: Run, reference: Run) -> Check:
    name = "the checkpoint loads into the plain model"
    missing = _not_measured(name, run)
    if missing:
        return missing
    saves = run.ranks[0].of("save")
    expected = set(reference.ranks[0].of("save")[-1]["keys"].get("model", []))
    if not saves:
        return Check(name, FAILED, "rank 0 saved nothing", "save a checkpoint with the model's state_dict")
    keys = saves[-1]["keys"].get("model", [])
    prefixed = [k for k in keys if k.startswith("module.")]
    if prefixed:
        return Check(
            name,
            FAILED,
            f"the saved model's keys start with 'module.' ({prefixed[0]})",
            "the DDP wrapper's state_dict names every weight module.<name>: save model.module.state_dict(), the "
            "plain model's, so the file loads at any world size and without DDP",
        )
    if set(keys) != expected:
        return Check(
            name, FAILED, f"the saved model's keys ({len(keys)}) are not the plain model's ({len(expected)})", ""
        )
    return Check(name, HELD, f"{len(keys)} keys, the plain model's, no 'module.' prefix")


def resume_continues(run: Run, resumed: Run | None, checkpoint: Path) -> Check:
    name = "a resume continues the curve"
    if resumed is None:
        return Check(name, NOT_RUN, "not measured: the 2-rank run did not end with a checkpoint at its path")
    if not resumed.ok:
        return Check(name, FAILED, resumed.how_it_ended())
    loaded = [r.rank for r in resumed.ranks if any(e["path"] == str(checkpoint) for e in r.of("load"))]
    per_epoch = _steps_per_epoch(run.ranks[0])
    if not per_epoch or not run.ranks[0].losses:  # a first run cut short (a starter's checkpoint race)
        return Check(name, NOT_RUN, f"not measured: the first run's rank 0 took {len(run.ranks[0].losses)} steps")
    first_epoch = statistics.fmean(run.ranks[0].losses[:per_epoch])
    last_epoch = statistics.fmean(run.ranks[0].losses[-per_epoch:])
    steps = resumed.ranks[0].steps
    losses = mean_losses(resumed)
    if len(loaded) != len(resumed.ranks):
        return Check(
            name,
            FAILED,
            f"{len(loaded)} of {len(resumed.ranks)} ranks loaded the checkpoint",
            "every rank loads it (into the plain model, before DDP wraps it) with map_location=its device",
        )
    if steps != _steps_per_epoch(run.ranks[0]) or not losses:
        return Check(
            name,
            FAILED,
            f"the resume ran {steps} steps for the 1 epoch left",
            "restore epochs_run from the checkpoint and train only the epochs after it",
        )
    now = statistics.fmean(losses)
    measured = (
        f"every rank loaded it and ran the 1 epoch left: mean loss {now:.3f} (the first run: epoch 0 "
        f"{first_epoch:.3f}, last epoch {last_epoch:.3f})"
    )
    if now > (first_epoch + last_epoch) / 2:
        return Check(name, FAILED, measured, "the weights or the optimizer state were not restored before training")
    return Check(name, HELD, measured)


def mean_reported(run: Run) -> Check:
    name = "the printed loss is the mean over ranks"
    missing = _not_measured(name, run)
    if missing:
        return missing
    printed = run.ranks[0].printed_losses()
    if not printed:
        return Check(name, FAILED, "rank 0 printed no 'step N ... loss X' line", "print each step's loss from rank 0")
    means, own = mean_losses(run), run.ranks[0].losses
    wrong = [s for s, v in printed.items() if s - 1 >= len(means) or abs(v - means[s - 1]) > PRINT_TOLERANCE]
    if wrong:
        s = wrong[0]
        is_own = s - 1 < len(own) and abs(printed[s] - own[s - 1]) <= PRINT_TOLERANCE
        if s - 1 >= len(means):  # rank 0 took more steps than another rank: no mean to print there
            measured = f"rank 0 printed step {s}, past the {len(means)} steps every rank took"
        else:
            measured = f"step {s}: printed {printed[s]:.6f}, the ranks' mean {means[s - 1]:.6f}"
        return Check(
            name,
            FAILED,
            measured + (" (rank 0's own loss)" if is_own else ""),
            "each rank's loss is over its share of the batch: dist.all_reduce it (SUM) and divide by the world size "
            "before rank 0 prints it",
        )
    return Check(name, HELD, f"{len(printed)} printed steps, each the mean of the ranks' losses")
