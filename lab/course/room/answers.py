"""The course's answers, out of the seats' reach: closed to every user but their owner while a room serves.

The answers are each exercise's reference solution (lab/course/exercises/NAME/solution.py in the installed package,
and any compiled copy of it), docs/answers.md (the lessons' questions answered, for instructors) and, in a checkout,
its git history, which holds every solution too. The grader needs none of them at runtime: it checks what the
learner's ranks did against rules and replays of its own. A seat is a system user of its own (or a container's
user), so closing them is their mode: a file readable by its owner alone (600), the checkout's .git entered by its
owner alone (700). The instructor who owns the checkout, and root who serves the room, still read them.

`lab room serve` closes them before any seat starts (nothing reopens them: their owner reads them as before); the
jupyter image closes them as it is built; a seat's own copy of docs/ leaves answers.md out (seats.copy_lessons).

    python -m lab.course.room.answers     # close them here, saying what was closed
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import lab.course.exercises
from lab.course.room import seats

EXERCISES = Path(lab.course.exercises.__file__).resolve().parent


def files() -> list[Path]:
    """Every answer file this installation holds: the solutions (and their compiled copies) and answers.md, in
    the checkout's docs/ and in the lessons' (the image's /opt/lab/docs, where LAB_LESSONS points beside it)."""
    found = [*EXERCISES.glob("*/solution.py"), *EXERCISES.glob("*/__pycache__/solution.*.pyc")]
    docs = {seats.CHECKOUT / "docs"}
    if os.environ.get(seats.LESSONS_ENV):
        docs.add(Path(os.environ[seats.LESSONS_ENV]).parent / "docs")
    found += [d / seats.ANSWERS_DOC for d in docs if (d / seats.ANSWERS_DOC).is_file()]
    return sorted(found)


def history() -> Path | None:
    """The checkout's git folder, where the solutions are kept in every commit; None outside a checkout."""
    folder = seats.CHECKOUT / ".git"
    return folder if folder.is_dir() else None


def open_to_others(paths: list[Path]) -> list[Path]:
    """The paths whose mode gives anyone but their owner any access."""
    return [p for p in paths if p.stat().st_mode & 0o077]


def close() -> list[Path]:
    """Close every answer (and the git history) to all but its owner; returns what was open and is closed now."""
    targets = [*files(), *filter(None, [history()])]
    closed = open_to_others(targets)
    for path in closed:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o077)
    return closed


def main() -> int:
    try:
        print(said(close()))
    except PermissionError as exc:  # another user's files: their owner, or root, closes them
        print(f"lab.course.room.answers: {exc.filename} is not this user's to close: run it as root", file=sys.stderr)
        return 2
    return 0


def said(closed: list[Path]) -> str:
    """One line for what close() did."""
    kept = len(files())
    if not closed:
        return f"the answers: {kept} files, closed to the seats already"
    return f"the answers: {kept} files and the git history closed to all but their owner ({len(closed)} were open)"


if __name__ == "__main__":
    raise SystemExit(main())
