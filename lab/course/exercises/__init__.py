"""Hands-on exercises: the learner writes the distributed code, the lab runs it under torchrun and grades what it
measured each rank doing (lab.course.exercises.observe watches from outside the learner's code).

An exercise is a folder here (its name with '_' for '-'), holding `starter.py` (what the learner starts from, with
TODOs), `solution.py` (the reference, for instructors and tests) and `check.py` (its `check(file, timeout)`, which
returns the checklist), plus one row of EXERCISES. The CLI reads this table while it parses arguments: no torch here.

>>> list(EXERCISES)[:2]
['convert', 'fix-set-epoch']
>>> folder("fix-set-epoch").name
'fix_set_epoch'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Exercise:
    name: str
    lesson: str  # the lesson whose "your turn" cell opens it ("01")
    writes: str  # what the learner writes, in a line
    minutes: int  # a learner's time for it, about


EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        Exercise(
            "convert", "01", "a single-device script made DDP: process group, sampler, DDP, rank-0 checkpoint", 25
        ),
        Exercise("fix-set-epoch", "02", "the sampler's epoch set, so each epoch has an order of its own", 5),
        Exercise(
            "fix-checkpoint", "02", "one rank writes the checkpoint, the others wait, it loads into a plain model", 10
        ),
        Exercise("fix-batchnorm", "02", "BatchNorm statistics of the global batch on every rank", 10),
        Exercise("fix-uneven", "02", "uneven shards that no longer leave a rank waiting in all-reduce", 10),
        Exercise("ring-allreduce", "03", "all-reduce from send and recv around a ring, any size, any world", 25),
        Exercise("own-ddp", "03", "DDP itself: broadcast, gradient hooks, buckets, async all-reduce, overlap", 40),
        Exercise("accumulate", "04", "gradient accumulation with no_sync: one all-reduce per optimizer step", 15),
        Exercise("shard", "05", "the model under FSDP2's fully_shard: less memory per rank, the same curve", 15),
    )
}


def folder(name: str) -> Path:
    return Path(__file__).parent / name.replace("-", "_")


def module_name(name: str) -> str:
    """The module whose `check` grades `name`.

    >>> module_name("ring-allreduce")
    'lab.course.exercises.ring_allreduce.check'
    """
    return f"lab.course.exercises.{name.replace('-', '_')}.check"
