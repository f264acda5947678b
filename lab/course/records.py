"""What a learner's lessons and exercises found, kept in one form where an instructor reads it, and pushed in a room.

A lesson's "what you should see" checks go to its folder's checks.json as they happen (`begin`, then `append`); an
exercise's checklist to <lesson runs>/exercises/NAME.json at once (`write`). Both are one record:

    {"kind": "lesson" | "exercise", "name", "seat", "started", "time", "verdict", "counts": {verdict: n},
     "checks": [{"name", "verdict", "detail", "fix", "time"}]}

in lab.verdict's words: a record's verdict is its checks' together, "not run" while a lesson has none yet. The
lesson runs' folder is LAB_LESSON_RUNS (a room's seat has it: <home>/runs/lessons), else the caller's default. In a
room with a Pushgateway (LAB_PUSHGATEWAY, set by the room's spawner) every write is pushed for the instructor's
dashboard; `lab room status` reads the files and makes one cell of each (`cell`).

>>> import tempfile; folder = Path(tempfile.mkdtemp())
>>> begin(folder, "01-demo")
>>> cell(read(folder), 2)
'running 0/2'
>>> append(folder, Check("the curves agree", HELD, "")); append(folder, Check("loss falls", FAILED, "2.3 -> 2.4"))
>>> r = read(folder); r["name"], r["verdict"], r["counts"], cell(r, 2)
('01-demo', 'failed', {'held': 1, 'failed': 1}, 'failed 1 of 2')
>>> cell(None, 2)
'not run'
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lab import atomic
from lab.errors import LabError
from lab.run.cluster import seat
from lab.verdict import FAILED, HELD, NOT_RUN, Check, overall, passes

LESSON_RUNS_ENV = "LAB_LESSON_RUNS"  # where a seat's lessons write their runs (and its exercises their records)
PUSHGATEWAY_ENV = "LAB_PUSHGATEWAY"  # host:port of the room's Pushgateway, where there is one
# An exercise check's limit a run (lab exercise check --timeout's default), where the room sets one: its seats share
# the cores, so a run slowed by the class gets longer than alone (a hang is stopped after 30 s without progress).
CHECK_TIMEOUT_ENV = "LAB_CHECK_TIMEOUT"
CHECK_TIMEOUT_SECONDS = 120.0  # alone
ROOM_CHECK_TIMEOUT_SECONDS = 300.0  # in a room's seat
LESSON_RECORD = "checks.json"  # in a lesson's folder
EXERCISES = "exercises"  # the exercises' records' folder, under the lesson runs' folder


def check_timeout() -> float:
    """An exercise check's limit a run: CHECK_TIMEOUT_ENV where set (a room's seat), else CHECK_TIMEOUT_SECONDS."""
    value = os.environ.get(CHECK_TIMEOUT_ENV, "").strip()
    if not value:
        return CHECK_TIMEOUT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 5 <= seconds < float("inf"):
        raise LabError(f"{CHECK_TIMEOUT_ENV}={value!r}: give seconds, 5 or more (or unset it for 120)")
    return seconds


def lesson_runs(default: Path | None = None) -> Path:
    """LAB_LESSON_RUNS, else `default`, else runs/lessons here."""
    return Path(os.environ.get(LESSON_RUNS_ENV) or default or Path("runs") / "lessons")


def exercise_path(name: str, runs: Path | None = None) -> Path:
    return (runs or lesson_runs()) / EXERCISES / f"{name}.json"


# ----------------------------------------------------------------------------- writing


def begin(folder: Path, lesson: str) -> None:
    """A lesson started: its record with no checks yet (the room shows it as running)."""
    _write(Path(folder) / LESSON_RECORD, _record("lesson", lesson, [], time.time()))


def append(folder: Path, check: Check) -> None:
    """One check of a lesson, appended to its record. A check outside a lesson's folder (a helper called on its
    own) has no record to join: nothing is written."""
    current = read(folder)
    if current is None:
        return
    checks = [*current["checks"], {**check.record(), "time": time.time()}]
    _write(Path(folder) / LESSON_RECORD, _record("lesson", current["name"], checks, current["started"]))


def write(exercise: str, checks: list[Check], started: float) -> Path:
    """An exercise's checklist, replacing its last one."""
    now = time.time()
    path = exercise_path(exercise)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, _record("exercise", exercise, [{**c.record(), "time": now} for c in checks], started))
    return path


def _record(kind: str, name: str, checks: list[dict[str, Any]], started: float) -> dict[str, Any]:
    verdicts = [c["verdict"] for c in checks]
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    return {
        "kind": kind,
        "name": name,
        "seat": seat.seat(),
        "started": started,
        "time": time.time(),
        "verdict": overall(verdicts) if checks else NOT_RUN,
        "counts": counts,
        "checks": checks,
    }


def _write(path: Path, record: dict[str, Any]) -> None:
    atomic.write_text(path, json.dumps(record, indent=1) + "\n")
    gateway = os.environ.get(PUSHGATEWAY_ENV, "").strip()
    if not gateway:
        return
    from lab.run.observability import room_metrics

    held = record["counts"].get(HELD, 0)
    failing = [c["name"] for c in record["checks"] if not passes(c["verdict"])]
    if record["kind"] == "lesson":  # by its number ("01"), as lab room serve pushes each lesson's check count
        room_metrics.push_lesson_checks(gateway, record["name"][:2], held, len(failing))
    else:
        room_metrics.push_exercise(gateway, record["name"], held, len(failing), failing[0] if failing else None)


# ----------------------------------------------------------------------------- reading


def read(folder: Path) -> dict[str, Any] | None:
    """A lesson's record, or None where the lesson never started (or wrote something unreadable)."""
    return _read(Path(folder) / LESSON_RECORD)


def read_exercises(runs: Path) -> dict[str, dict[str, Any]]:
    """{exercise: its record} for every exercise checked under `runs` (unreadable ones left out)."""
    found = {}
    for path in sorted((runs / EXERCISES).glob("*.json")):
        record = _read(path)
        if record is not None:
            found[path.stem] = record
    return found


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("checks"), list) else None


def cell(record: dict[str, Any] | None, expected: int | None = None) -> str:
    """One cell of the room's table: not run; held (n/m); failed (k of m, or the first check that failed); running
    n/m while a lesson's checks are still coming.

    >>> cell({"kind": "exercise", "verdict": "failed", "counts": {"failed": 1},
    ...       "checks": [{"name": "disjoint shards", "verdict": "failed"}]})
    'failed: disjoint shards'
    """
    if record is None:
        return NOT_RUN
    counts, verdict = record.get("counts", {}), record.get("verdict")
    failing = [c["name"] for c in record["checks"] if not passes(c["verdict"])]
    if record.get("kind") == "exercise":
        return HELD if verdict == HELD else f"{verdict}: {failing[0] if failing else '?'}"
    held = counts.get(HELD, 0)
    if failing:
        return f"{FAILED} {len(failing)} of {expected}"
    if expected is not None and held >= expected:
        return f"{HELD} {held}/{expected}"
    return f"running {held}/{expected}"
