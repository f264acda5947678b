"""Each exercise's last check, kept where an instructor can read it: <lesson runs>/exercises/NAME.json.

The lesson runs' folder is LAB_LESSON_RUNS (a room's seat has it: <home>/runs/lessons) or runs/lessons here.
In a room with a Pushgateway (LAB_PUSHGATEWAY) the outcome is pushed as well, for the room's dashboard;
`lab room status` reads the files.

>>> import tempfile, os; os.environ["LAB_LESSON_RUNS"] = tempfile.mkdtemp()
>>> path = record("convert", [{"check": "runs on 2 ranks", "held": True}, {"check": "a new order", "held": False}])
>>> state(read_all(path.parent.parent)["convert"])
'failed: a new order'
>>> state(None)
'not tried'
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lab import atomic
from lab.run.cluster import seat

LESSON_RUNS_ENV = "LAB_LESSON_RUNS"
PUSHGATEWAY_ENV = "LAB_PUSHGATEWAY"
FOLDER = "exercises"


def folder(lesson_runs: Path | None = None) -> Path:
    root = lesson_runs or Path(os.environ.get(LESSON_RUNS_ENV) or Path("runs") / "lessons")
    return Path(root) / FOLDER


def record(exercise: str, checks: list[dict[str, Any]]) -> Path:
    failed = [c["check"] for c in checks if not c["held"]]
    content = {
        "exercise": exercise,
        "seat": seat.seat(),
        "time": time.time(),
        "passed": not failed,
        "failed_checks": failed,
        "checks": checks,
    }
    path = folder() / f"{exercise}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(content, indent=1) + "\n")
    gateway = os.environ.get(PUSHGATEWAY_ENV, "").strip()
    if gateway:
        from lab.run.observability import room_metrics

        room_metrics.push_exercise(
            gateway, exercise, len(checks) - len(failed), len(failed), failed[0] if failed else None
        )
    return path


def read_all(lesson_runs: Path) -> dict[str, dict[str, Any]]:
    """{exercise: its record} for every exercise checked under `lesson_runs` (unreadable ones left out)."""
    found = {}
    for path in sorted(folder(lesson_runs).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("checks"), list):
            found[path.stem] = doc
    return found


def state(doc: dict[str, Any] | None) -> str:
    """passed / failed: the first failing check / not tried: one cell of the room's table."""
    if doc is None:
        return "not tried"
    if doc.get("passed"):
        return "passed"
    failed = doc.get("failed_checks") or ["?"]
    return f"failed: {failed[0]}"
