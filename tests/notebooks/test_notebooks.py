"""Every lesson in notebooks/ executed headless, cell by cell, by a real Jupyter kernel (nbclient + ipykernel),
as JupyterLab would run it: a cell that raises (a lab command that failed, a "what you should see" check that
did not hold) fails the test with that cell's error. Each lesson runs once a session (tests/lessons.py): the
tests that assert the details of the same runs (tests/distributed/test_pitfalls.py, ...) read its results.

Lessons 1-5 end with "your turn" cells (lesson.exercise, lesson.check_exercise): they run here with the reference
solutions in place, as a learner's finished work, and each exercise's recorded check must have passed. They are
the learner's, not the lesson's checks: a failing one does not stop the notebook, and none counts as a lesson check."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from tests.conftest import ROOT
from tests.infra.test_room import cannot_run as room_test_cannot_run
from tests.lessons import exercises_of

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def test_there_is_one_lesson_per_part_of_the_course():
    assert [p.name[:2] for p in LESSONS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_clean_with_its_checks(path, lessons):
    if path.stem == "06_metrics_in_prometheus" and not shutil.which("prometheus") and os.environ.get("CI") != "true":
        pytest.skip("no prometheus on PATH (scripts/install-test-tools.sh installs it as root on Debian)")
    if path.stem == "01_baseline_and_ddp" and room_test_cannot_run() is None:
        pytest.skip(
            "tests/infra/test_room.py runs lesson 1 in three seats' own kernels at once, with the same "
            "checks (every 'what you should see' held, its table and plots shown): not a fourth time here"
        )
    lesson = lessons(path.stem)  # executed once this session: a test that reads its results may have run it
    assert lesson.notebook.metadata["kernelspec"]["name"] == "python3"
    checks = [c for c in lesson.notebook.cells if c.cell_type == "code" and "lesson.expect(" in c.source]
    assert checks, f"{path.name} ends without a 'what you should see' check"
    lesson.check()  # a cell that raised (a lab command that failed, a check that did not hold) fails here
    assert not [o for o in lesson.outputs if o.output_type == "error"]
    assert lesson.printed.count("as expected: ") == sum(c.source.count("lesson.expect(") for c in checks)
    assert any(o.output_type == "display_data" for o in lesson.outputs), "the lesson shows no table or plot inline"
    recorded = lesson.exercises()  # the "your turn" cells' checks, run on the reference solutions
    for name in exercises_of(path):
        assert name in recorded, f"{path.name}: no check of exercise {name} was recorded"
        failing = [c["name"] for c in recorded[name]["checks"] if c["verdict"] != "held"]
        assert recorded[name]["verdict"] == "held", f"{name}'s reference solution did not hold: {failing}"


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_lesson_ends_with_its_exercises_after_its_own_checks(path):
    """Each exercise of the lesson (lab.course.exercises.EXERCISES) is opened and then checked by cells of their own
    after
    the lesson's last "what you should see" check, so a learner's failing exercise never stands before one."""
    import jupytext

    code = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
    last_check = max(i for i, source in enumerate(code) if "lesson.expect(" in source)
    opened = {m: i for i, s in enumerate(code) for m in re.findall(r'lesson\.exercise\("([\w-]+)"\)', s)}
    checked = {m: i for i, s in enumerate(code) for m in re.findall(r'lesson\.check_exercise\("([\w-]+)"\)', s)}
    names = exercises_of(path)
    assert list(opened) == list(checked) == names, (opened, checked, names)
    assert all(last_check < opened[name] < checked[name] for name in names), (last_check, opened, checked)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_make_notebook_leaves_the_lesson_files_as_committed(path):
    """`make notebook` pairs each .py with its .ipynb (jupytext --sync), rewriting the .py in jupytext's own form:
    a lesson committed in another form would show as changed in every learner's checkout."""
    import jupytext

    assert jupytext.writes(jupytext.read(path), fmt="py:percent") == path.read_text()


# What each lesson's first cell (the cell that plans) must give on a host with one GPU, by the names its later
# cells use: 2 CPU processes at CPU sizes (one GPU cannot hold two ranks, and NCCL cannot share it).
ONE_GPU_PLAN = {
    "01_baseline_and_ddp": {"config": "smoke", "n": 2},
    "02_pitfalls": {"n": 2},
    "03_collectives": {"n": 2},
    "04_scaling_and_levers": {"n": 2, "gpu": False, "config": "smoke"},
    "05_memory_and_choosing": {"gpu": False, "width": "16"},
    "06_metrics_in_prometheus": {"n": 2, "gpu": False},
    "07_multi_node": {"per_node": 1, "config": "smoke"},
}


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_plans_for_a_one_gpu_host(path, tmp_path, monkeypatch, capsys):
    """Only the planning cell runs, under LAB_LESSON_FAKE_GPUS=1 (this machine has no GPU; executing every
    lesson a second time would cost minutes of CI): it plans 2 CPU ranks, says why, and no later cell decides
    about devices by itself (so every command gets the plan's environment through lesson.run/lab/start)."""
    import jupytext

    from lab.course.teaching import lesson

    monkeypatch.setenv(lesson.FAKE_GPUS_ENV, "1")
    monkeypatch.setenv("LAB_LESSON_RUNS", str(tmp_path / "lessons"))
    code = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
    namespace: dict = {}
    exec(compile(code[0], f"{path.name}, first cell", "exec"), namespace)
    planned = namespace["plan"]
    assert planned == lesson.plan(gpus=1)
    assert (planned.ranks, planned.gpu, planned.env) == (2, False, {"CUDA_VISIBLE_DEVICES": ""})
    assert {k: namespace[k] for k in ONE_GPU_PLAN[path.stem]} == ONE_GPU_PLAN[path.stem]
    assert planned.why in capsys.readouterr().out
    for later in code[1:]:
        assert not any(s in later for s in ("lesson.on_gpu(", "lesson.devices(", "torch.cuda")), later[:200]
        # nor rebinds a planned name (lesson 6 once reused `config` for Prometheus's YAML: its run got a dict)
        for name in ONE_GPU_PLAN[path.stem]:
            assert not re.search(rf"^\s*(?:{name}\s*=[^=]|for {name} in)", later, re.M), (name, later[:200])


def test_every_command_a_lesson_starts_gets_the_plans_environment(monkeypatch):
    """A real child process: on a (faked) 1-GPU host the GPU is hidden from it; a cell's own env still wins."""
    import sys

    from lab.course.teaching import lesson

    monkeypatch.setenv(lesson.FAKE_GPUS_ENV, "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    show = [sys.executable, "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"]
    assert lesson.run(*show).stdout.strip() == "''"
    started = lesson.start(show, env={"CUDA_VISIBLE_DEVICES": "3"})
    assert started.communicate(timeout=60)[0].strip() == "'3'"
    monkeypatch.setenv(lesson.FAKE_GPUS_ENV, "2")
    assert lesson.run(*show).stdout.strip() == "'0'"
