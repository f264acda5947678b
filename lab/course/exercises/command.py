"""`lab exercise list | start NAME | check NAME [FILE]`: the hands-on exercises.

    lab exercise list                       name, lesson, what the learner writes, minutes
    lab exercise start convert              copies the starter to exercises/convert.py (never over existing work)
    lab exercise check convert              runs exercises/convert.py under torchrun, watched, and prints the checklist

`check` exits 0 when every check holds, 1 when one fails, 2 on bad input (no such exercise, no such file, a file
that is not Python). Each check's outcome is kept for the room (lab.course.records).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab import atomic
from lab.course.exercises import EXERCISES, folder, module_name
from lab.errors import EXIT_FAILED, EXIT_OK, LabError
from lab.verdict import FAILED, Check, overall, passes

DEFAULT_DIR = Path("exercises")


def listing(args: argparse.Namespace) -> int:
    if args.json:
        rows = [
            {"name": e.name, "lesson": e.lesson, "writes": e.writes, "minutes": e.minutes} for e in EXERCISES.values()
        ]
        atomic.write_text(Path(args.json), json.dumps(rows, indent=1) + "\n")
    width = max(map(len, EXERCISES))
    print("Exercises (lab exercise start NAME, then lab exercise check NAME):")
    print(f"  {'name':<{width}}  lesson  minutes  you write")
    for e in EXERCISES.values():
        print(f"  {e.name:<{width}}  {e.lesson:<6}  {e.minutes:>7}  {e.writes}")
    return EXIT_OK


def default_file(name: str, directory: Path | None = None) -> Path:
    return (directory or DEFAULT_DIR) / f"{name.replace('-', '_')}.py"


def start_command(args: argparse.Namespace) -> int:
    return start(args.name, args.dir)


def start(name: str, directory: Path | None) -> int:
    target = default_file(name, directory)
    if target.exists():
        print(f"your work on {name} is already at {target}: open it there (lab exercise check {name} {target})")
        return EXIT_OK
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder(name) / "starter.py", target)
    print(f"{name}: {EXERCISES[name].writes}")
    print(f"the starter is at {target}: do its TODOs, then lab exercise check {name} {target}")
    return EXIT_OK


def learner_file(name: str, given: Path | None, directory: Path | None) -> Path:
    """The file to grade, refused in one line when it is missing or not Python."""
    path = given or default_file(name, directory)
    if not path.is_file():
        hint = "" if given else f" (lab exercise start {name} puts the starter there)"
        raise LabError(f"{path}: no such file{hint}")
    try:
        ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno else str(path)
        raise LabError(f"{where}: not Python: {exc.msg}") from None
    except ValueError as exc:  # null bytes: a binary file
        raise LabError(f"{path}: not Python: {exc}") from None
    return path.resolve()


def graded(args: argparse.Namespace, class_name: str | None, tmp: Path) -> tuple[Path, dict[str, str]]:
    """The file to run and the check's options. `--class MODULE:NAME` grades NAME imported from MODULE (from the
    current folder, as Python finds it): a file of one import line stands in for the learner's."""
    if not class_name:
        return learner_file(args.name, args.file, args.dir), {}
    module, _, name = class_name.rpartition(":")
    if not name.isidentifier() or (module and not all(part.isidentifier() for part in module.split("."))):
        raise LabError(f"--class {class_name}: not a class name (NAME, or MODULE:NAME such as cs336_systems.ddp:DDP)")
    if not module:
        return learner_file(args.name, args.file, args.dir), {"class_name": name}
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise LabError(f"--class {class_name}: no module {module.split('.')[0]} here (run from the folder above it)")
    stand_in = tmp / "graded_class.py"
    stand_in.write_text(f"from {module} import {name}  # lab exercise check --class {class_name}\n")
    return stand_in, {"class_name": name}


def _grade(grade: Any, path: Path, timeout: float, options: dict[str, str]) -> list[Check]:
    try:
        return list(grade(path, timeout, **options))
    except Exception as exc:  # the grader's own run (a reference) failed: said, recorded, never a traceback
        return [Check("the grader's own runs", FAILED, f"could not grade: {exc}".splitlines()[0][:300])]


def check(args: argparse.Namespace) -> int:
    from lab.course import records
    from lab.course.exercises import grading

    class_name = getattr(args, "class_name", None)
    if class_name and args.name != "own-ddp":
        raise LabError(f"--class: {args.name} grades a file, not a class (--class is own-ddp's)")
    timeout = args.timeout if args.timeout is not None else records.check_timeout()
    with tempfile.TemporaryDirectory(prefix="lab-class-") as tmp:
        path, options = graded(args, class_name, Path(tmp))
        grade = importlib.import_module(module_name(args.name)).check
        print(f"lab exercise check {args.name}: running {path} under torchrun, watched ...", file=sys.stderr)
        started = time.time()
        checks = grading.not_measured_after_failure(_grade(grade, path, timeout, options))
    seconds = time.time() - started
    records.write(args.name, checks, started)
    verdict = overall(c.verdict for c in checks)
    print(grading.render(args.name, checks) + f" ({seconds:.0f} s)")
    if args.json:
        doc = {
            "exercise": args.name,
            "file": class_name if class_name and ":" in class_name else str(path),
            "verdict": verdict,
            "seconds": round(seconds, 1),
            "checks": [c.record() for c in checks],
        }
        atomic.write_text(Path(args.json), json.dumps(doc, indent=1) + "\n")
    return EXIT_OK if passes(verdict) else EXIT_FAILED
