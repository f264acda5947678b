"""The `fix-checkpoint` exercise's checks: the learner's script run on 2 ranks, every torch.save and torch.load of
every rank watched (lab.course.exercises.observe records each call's path, time and, for a save, the state dict's keys).

What each check reads from the traces, the symptoms `lab pitfall checkpoint-every-rank` demonstrates:
- rank 0 alone writes it: which ranks called torch.save on a file in the checkpoint's folder;
- no rank reads it before it is written: each load on a rank other than 0 against rank 0's saves, in the order
  the collectives impose. A load comes after a save when the loading rank had left a collective that rank 0
  entered only after its save returned (a barrier after the save does that); a load with no collective between
  it and a save is a race, whichever came first this time, and fails. The gap in time is shown beside it;
- it loads into the plain model: the keys of the state dict rank 0 saved, none of which may start "module."
  (DDP's prefix for every name; the plain model knows none of them).
There is no "ends cleanly" check here: a run with any of these mistakes may crash (a missing or torn file, a
strict load that finds no key), and each mistake must fail its own check only. A run that ends badly is said
in the measured text, and a check it leaves nothing to measure for fails as not measured.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from lab.course.exercises.grading import Run, observed
from lab.course.exercises.trace import Rank
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLD = 2
CHECKPOINT = "toy.pt"


def arguments(checkpoint: Path) -> list[str]:
    return ["--checkpoint", str(checkpoint), "--samples", "96", "--epochs", "2", "--batch-size", "8", "--seed", "0"]


def measure(file: Path, timeout_seconds: float) -> tuple[Run, Path]:
    """The run, and the folder its checkpoint was in (gone by the time the checks read the traces)."""
    with tempfile.TemporaryDirectory(prefix="lab-fix-checkpoint-") as tmp:
        work = Path(tmp).resolve()  # the traces hold real paths
        return observed(file, WORLD, arguments(work / CHECKPOINT), timeout_seconds=timeout_seconds), work


def judge(run: Run, work: Path) -> list[Check]:
    return [rank0_writes(run, work), loads_after_save(run, work), plain_keys(run, work)]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(*measure(file, timeout_seconds))


def _in(work: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events on a file in the checkpoint's folder (the file itself, or a temporary file beside it)."""
    return [e for e in events if Path(e["path"]).parent == work]


def _ending(run: Run) -> str:
    return "" if run.ok else f" ({run.how_it_ended()})"


def rank0_writes(run: Run, work: Path) -> Check:
    name = "rank 0 alone writes the checkpoint"
    saves = [len(_in(work, r.of("save"))) for r in run.ranks]
    measured = "torch.save calls: " + ", ".join(f"rank {r} {n}" for r, n in enumerate(saves))
    if not saves or saves[0] == 0:
        return Check(
            name,
            FAILED,
            measured + _ending(run),
            "save the checkpoint on rank 0 (dist.get_rank() == 0): it holds the same weights as every other rank",
        )
    if any(saves[1:]):
        return Check(
            name,
            FAILED,
            measured,
            "after a DDP step every rank holds the same weights, so every rank saving writes the same file N "
            "times at once, each truncating what another wrote: save only where dist.get_rank() == 0",
        )
    return Check(name, HELD, measured)


def _position(rank: Rank, index: int) -> tuple[int, int]:
    """(collectives entered, collectives left) by `rank` before its event at `index`."""
    before = [e for e in rank.events[:index] if e["e"] == "coll"]
    return sum(e["phase"] == "enter" for e in before), sum(e["phase"] == "exit" for e in before)


def _indexed(rank: Rank, kind: str, work: Path) -> list[tuple[int, dict[str, Any]]]:
    return [(i, e) for i, e in enumerate(rank.events) if e["e"] == kind and Path(e["path"]).parent == work]


def loads_after_save(run: Run, work: Path) -> Check:
    name = "no rank reads the checkpoint before rank 0 has written it"
    saves = _indexed(run.ranks[0], "save", work) if run.ranks else []
    loads = [(r, i, e) for r in run.ranks[1:] for i, e in _indexed(r, "load", work)]
    if not saves or not loads:
        what = "rank 0 saved nothing" if not saves else "no rank but 0 loaded the checkpoint"
        return Check(name, NOT_RUN, f"not measured: {what}{_ending(run)}", "every rank restores the checkpoint")
    for rank, i, load in loads:
        entered, left = _position(rank, i)
        for j, save in saves:
            save_entered, save_left = _position(run.ranks[0], j)
            # ordered when a collective lies between them: the loader left one rank 0 entered after saving,
            # or rank 0 left one the loader entered after loading
            if left > save_entered or save_left > entered:
                continue
            gap_ms = (load["t"] - save["t"]) * 1000  # a save event is written when torch.save returns
            when = f"{-gap_ms:.1f} ms before" if gap_ms < 0 else f"{gap_ms:.1f} ms after"
            luck = "" if gap_ms < 0 else ", after it by luck"
            return Check(
                name,
                FAILED,
                f"rank {rank.rank} called torch.load {when} rank 0's torch.save returned, with no collective "
                f"between them{luck}{_ending(run)}",
                "nothing makes the other ranks wait for rank 0's write: put dist.barrier() after the save (on every "
                "rank, outside the rank-0 branch), so no rank loads a missing or half-written file",
            )
    after = ", ".join(f"rank {r.rank} {(load['t'] - saves[-1][1]['t']) * 1000:.1f} ms" for r, _, load in loads)
    return Check(
        name,
        HELD,
        f"every load on ranks 1..{WORLD - 1} came after a collective rank 0 entered once its save returned "
        f"(after the last save: {after})",
    )


def plain_keys(run: Run, work: Path) -> Check:
    name = "the checkpoint loads into the plain model"
    saves = _in(work, run.ranks[0].of("save")) if run.ranks else []
    keys = [k for save in saves for found in save.get("keys", {}).values() for k in found]
    if not keys:
        what = "rank 0 saved nothing" if not saves else "rank 0 saved no state dict of tensors"
        return Check(name, NOT_RUN, f"not measured: {what}{_ending(run)}", "save the model's state_dict()")
    prefixed = [k for k in keys if k.startswith("module.")]
    if prefixed:
        return Check(
            name,
            FAILED,
            f"{len(prefixed)} of {len(keys)} saved keys start with 'module.' ({prefixed[0]}){_ending(run)}",
            "the DDP wrapper's state_dict names every weight module.<name>: save the wrapped model's "
            "(model.module.state_dict()), whose names the plain model knows, at any world size and without DDP",
        )
    return Check(name, HELD, f"{len(keys)} keys saved ({', '.join(keys[:4])}), no 'module.' prefix")
