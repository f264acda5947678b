"""What a lesson's "what you should see" checks found, kept where an instructor can read it.

Each lesson's folder (runs/lessons/NN-name/, emptied when the lesson starts again) gets checks.json: the lesson,
the seat (in a workshop room), when it started, and each check in order with whether it held. A command of the
lesson that failed is recorded as a failed check too, since the learner's notebook stopped there. In a room with
a Pushgateway (LAB_PUSHGATEWAY, set by the room's spawner) the counts are pushed as they change, for the
instructor's dashboard; `lab room status` reads the files.

>>> import tempfile; folder = Path(tempfile.mkdtemp())
>>> begin(folder, "01-demo")
>>> record(folder, "the curves agree", True); record(folder, "loss falls", False)
>>> r = read(folder); r["lesson"], r["passed"], r["failed"], [c["check"] for c in r["checks"]]
('01-demo', 1, 1, ['the curves agree', 'loss falls'])
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from lab import atomic
from lab.run.cluster import seat

RECORD = "checks.json"
PUSHGATEWAY_ENV = "LAB_PUSHGATEWAY"  # host:port of the room's Pushgateway, where there is one


def begin(folder: Path, lesson: str) -> None:
    """A lesson started: a record with no checks yet (the room shows it as running)."""
    _write(
        folder, {"lesson": lesson, "seat": seat.seat(), "started": time.time(), "checks": [], "passed": 0, "failed": 0}
    )


def record(folder: Path, check: str, held: bool) -> None:
    """One check's outcome, appended to the lesson's record (and pushed, in a room with a Pushgateway)."""
    current = read(folder)
    if current is None:  # a check outside a lesson's folder (a helper called on its own): nothing to add to
        return
    current["checks"].append({"check": check, "held": held, "time": time.time()})
    current["passed" if held else "failed"] += 1
    _write(folder, current)


def read(folder: Path) -> dict[str, Any] | None:
    """The lesson's record, or None where the lesson never started (or wrote something unreadable)."""
    try:
        found = json.loads((Path(folder) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("checks"), list) else None


def _write(folder: Path, content: dict[str, Any]) -> None:
    atomic.write_text(Path(folder) / RECORD, json.dumps(content, indent=1) + "\n")
    gateway = os.environ.get(PUSHGATEWAY_ENV, "").strip()
    if gateway:
        from lab.run.observability import room_metrics

        # the lesson by its number ("01"), as lab room serve pushes each lesson's check count
        room_metrics.push_lesson_checks(gateway, content["lesson"][:2], content["passed"], content["failed"])
