"""One status vocabulary for every health check: `lab doctor`'s lines and `lab validate`'s records alike.

A check that could not look (its tool not installed, its output unreadable) is never a pass: on a GPU node either
is a problem, said by name, and an operator who knowingly lacks the tool waives it (`--expect journal=skip`).

>>> passes(OK), passes(NOTE), passes(FAIL), passes(UNREADABLE)
(True, True, False, False)
"""

from __future__ import annotations

OK = "ok"  # looked, and it holds
WARN = "warn"  # holds, with something a user should fix (a small /dev/shm)
NOTE = "note"  # reported, not judged (a GPU's PCIe generation lowered while idle)
FAIL = "fail"  # looked, and it does not hold
NOT_PRESENT = "not present"  # the tool that would tell is not installed
UNREADABLE = "unreadable"  # the tool ran, or its record exists, and nothing readable came of it
NOT_RUN = "not run"  # not asked for (no DCGM level given)
NOT_APPLICABLE = "not applicable"  # does not apply to this node (InfiniBand on a CPU node)

STATUSES = (OK, WARN, NOTE, FAIL, NOT_PRESENT, UNREADABLE, NOT_RUN, NOT_APPLICABLE)


def passes(status: str) -> bool:
    """Whether a check with this status lets the node pass (whether it raised a problem is the check's to say)."""
    return status in (OK, WARN, NOTE, NOT_RUN, NOT_APPLICABLE)
