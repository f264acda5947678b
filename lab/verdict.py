"""One vocabulary for every verdict the lab prints or records, and the record of one check.

A check held (it looked, and what it asks holds), failed (it looked, and it does not hold; or it could not look
where it should have: a tool missing, a record unreadable), was not run (it should have looked and did not: left out
for time, cut by a deadline, a run it depends on ended first), or is not applicable (nothing to look at here: a CPU
node has no InfiniBand, a waived check, a step that needs more GPUs than the host has). Only held and not applicable
pass: a check that was not run never passes, so nothing passes without testing what it names.

`lab doctor`, `lab validate`, `lab accept`, the device check, the exercises' grader, the lessons' checks and the room
all use these four words and `passes()`; a record's field for them is named `verdict` (a run's `status` in
summary.json is its state: completed, stopped, failed). tests/unit/test_verdicts.py holds every record to it.

>>> [passes(v) for v in VERDICTS]
[True, False, False, True]
>>> overall([HELD, NOT_APPLICABLE, NOT_RUN]), overall([HELD, FAILED, NOT_RUN]), overall([])
('not run', 'failed', 'not applicable')
>>> print(Check("shm", HELD, "/dev/shm is 64 MiB", "run containers with --ipc host").line())
held    shm        /dev/shm is 64 MiB; run containers with --ipc host
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

HELD = "held"
FAILED = "failed"
NOT_RUN = "not run"
NOT_APPLICABLE = "not applicable"

VERDICTS = (HELD, FAILED, NOT_RUN, NOT_APPLICABLE)


def passes(verdict: str) -> bool:
    """Whether a check with this verdict lets what it judges pass (a host, a node, a step, an exercise)."""
    if verdict not in VERDICTS:
        raise ValueError(f"{verdict!r} is not a verdict; expected one of {', '.join(VERDICTS)}")
    return verdict in (HELD, NOT_APPLICABLE)


def overall(verdicts: Iterable[str]) -> str:
    """The verdict of several checks together: failed if one failed, else not run if one was not run, else held if
    one held; not applicable when none applies (or there are none)."""
    seen = set(verdicts)
    for verdict in (FAILED, NOT_RUN, HELD):
        if verdict in seen:
            return verdict
    return NOT_APPLICABLE


@dataclass(frozen=True)
class Check:
    """One check's outcome: its name, its verdict, what was seen, and what to do about it (shown whenever there is
    one: a check may hold and still have something to fix, as a small /dev/shm)."""

    name: str
    verdict: str  # one of VERDICTS
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        passes(self.verdict)  # an unknown word is refused where it is made

    @property
    def passes(self) -> bool:
        return passes(self.verdict)

    def line(self) -> str:
        """
        >>> Check("xid", FAILED, "2 XID(s) since boot: 79, 48", "drain the node").line()
        'failed  xid        2 XID(s) since boot: 79, 48; drain the node'
        """
        text = f"{self.verdict:<7} {self.name:<10} {self.detail}"
        return f"{text}; {self.fix}" if self.fix else text

    def record(self) -> dict[str, Any]:
        """The form a JSON record keeps: {name, verdict, detail} and the fix where there is one."""
        kept: dict[str, Any] = {"name": self.name, "verdict": self.verdict, "detail": self.detail}
        return {**kept, "fix": self.fix} if self.fix else kept
