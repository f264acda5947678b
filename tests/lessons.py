"""Each lesson executed once per test session, headless, by a real Jupyter kernel (nbclient + ipykernel), as
JupyterLab would run it: tests/notebooks asserts that its "what you should see" checks held, and the tests that
would make the same runs again (a pitfall, a benchmark) read what the lesson's own commands wrote instead: its
JSON files and its printed output. One run, asserted twice.

    lesson = lessons("02_pitfalls")                # the conftest fixture `lessons`
    lesson.folder("02-pitfalls") / "set-epoch.json"
    lesson.printed                                 # every stream output of every cell

Once a session, not once a process: under pytest-xdist (make test runs two workers) the first worker to ask for
a lesson executes it under a file lock in a folder every worker of the session shares, and the executed notebook
is kept there; a worker that asks later waits for the lock and reads it.

A lesson runs in a checkout of its own (checkout()), with the reference solutions of its exercises where its "your
turn" cells look for the learner's work: they run and pass as a learner's finished work would, and the repository's
own exercises/ (a developer's work on them) is never touched.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT_SECONDS = 600  # a cell's limit: a hung collective must fail the lesson, not CI


@dataclass
class ExecutedLesson:
    path: Path
    runs: Path  # LAB_LESSON_RUNS of this execution: each lesson's folder is under it, its exercises' checks too
    notebook: Any  # the executed notebook (nbformat), outputs included
    error: BaseException | None = None  # what stopped the execution (a cell that raised), or None
    outputs: list[Any] = field(default_factory=list)

    def folder(self, name: str) -> Path:
        """The lesson's output folder (lesson.output_dir(name) in its first cell)."""
        self.check()
        return self.runs / name

    @property
    def printed(self) -> str:
        self.check()
        return "".join(o.get("text", "") for o in self.outputs if o.output_type == "stream")

    def output_of(self, *words: str) -> str:
        """What one `lab WORDS ...` command of the lesson printed: from its `$ ... -m lab WORDS` line (lesson.run
        prints it) to the next command's."""
        blocks = self.printed.split("\n$ ")
        wanted = " -m lab " + " ".join(words)
        found = [b for b in blocks if wanted + " " in b.split("\n", 1)[0] + " "]
        assert len(found) == 1, f"{self.path.name}: {len(found)} commands `lab {' '.join(words)}` printed"
        return found[0]

    def exercises(self) -> dict[str, dict[str, Any]]:
        """{exercise: its recorded check} for every exercise the lesson's "your turn" cells checked."""
        from lab.course import records

        return records.read_exercises(self.runs)

    def check(self) -> None:
        """Fail a test that reads this lesson's results when the lesson itself did not run through."""
        if self.error is not None:
            raise AssertionError(
                f"{self.path.name} did not run through, so its results are missing: {str(self.error)[-3000:]}"
            )


def executed(path: Path, shared: Path) -> ExecutedLesson:
    """The lesson at `path`, executed once for everyone who shares the folder `shared`."""
    import fcntl

    import nbformat

    folder = shared / path.stem
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker executing this lesson: wait for it
        record, failure = folder / "executed.ipynb", folder / "error.txt"
        if not record.exists():
            lesson = execute(path, folder / "runs", checkout(folder / "checkout", exercises_of(path)))
            if lesson.error is not None:
                failure.write_text(str(lesson.error))
            nbformat.write(lesson.notebook, str(record))
            return lesson
    notebook = nbformat.read(str(record), as_version=4)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    error = RuntimeError(failure.read_text()) if failure.exists() else None
    return ExecutedLesson(path, folder / "runs", notebook, error, outputs)


def exercises_of(path: Path) -> list[str]:
    """The exercises whose "your turn" cells end the lesson at `path` (lab.course.exercises.EXERCISES' lesson
    column)."""
    from lab.course.exercises import EXERCISES

    return [e.name for e in EXERCISES.values() if e.lesson == path.name[:2]]


def solution_file(name: str) -> Path:
    """Where a lesson's cells look for the learner's work on `name`, relative to the checkout
    (lab.course.teaching.lesson.exercise_file)."""
    return Path("exercises") / f"{name.replace('-', '_')}.py"


def checkout(folder: Path, exercises: list[str]) -> Path:
    """A checkout for one execution of a lesson: notebooks/ (where its kernel starts) and exercises/ folders of its
    own, every other entry of the repository linked (the lessons read monitoring/ and playbooks/ through
    lab.course.teaching.lesson.checkout()), and the reference solution of each of `exercises` where the learner's work
    goes: the "your turn" cells find it there, leave it be (lesson.exercise never overwrites work) and check it."""
    from lab.course.exercises import folder as exercise_folder

    (folder / "notebooks").mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in ("notebooks", "exercises", "runs", ".git") and not os.path.lexists(folder / entry.name):
            (folder / entry.name).symlink_to(entry)
    for name in exercises:
        target = folder / solution_file(name)
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(exercise_folder(name) / "solution.py", target)
    return folder


def execute(path: Path, runs: Path, home: Path = ROOT) -> ExecutedLesson:
    """Run every cell of the lesson at `path` (kernels start in notebooks/ of the checkout `home`, as JupyterLab
    starts them; runs write under `runs`, as they would under runs/lessons/ in the checkout; 1 thread per process)."""
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = jupytext.read(path)
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=TIMEOUT_SECONDS,
        resources={"metadata": {"path": str(home / "notebooks")}},
    )
    saved = {name: os.environ.get(name) for name in ("LAB_LESSON_RUNS", "OMP_NUM_THREADS")}
    os.environ.update({"LAB_LESSON_RUNS": str(runs), "OMP_NUM_THREADS": "1"})  # the kernel inherits them
    error = None
    try:
        client.execute()
    except CellExecutionError as exc:
        error = exc
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    return ExecutedLesson(path, runs, notebook, error, outputs)
