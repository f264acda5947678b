"""Every lesson in notebooks/ executed headless, cell by cell, by a real Jupyter kernel (nbclient + ipykernel),
as JupyterLab would run it: a cell that raises (a lab command that failed, a "what you should see" check that
did not hold) fails the test with that cell's error."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import ROOT

LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def test_there_is_one_lesson_per_part_of_the_course():
    assert [p.name[:2] for p in LESSONS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_clean_with_its_checks(path, tmp_path, monkeypatch):
    if path.stem == "06_metrics_in_prometheus" and not shutil.which("prometheus") and os.environ.get("CI") != "true":
        pytest.skip("no prometheus on PATH (scripts/install-test-tools.sh installs it as root on Debian)")
    import jupytext
    from nbclient import NotebookClient

    notebook = jupytext.read(path)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    checks = [c for c in notebook.cells if c.cell_type == "code" and "lesson.expect(" in c.source]
    assert checks, f"{path.name} ends without a 'what you should see' check"
    # Kernels start in notebooks/, as JupyterLab starts them; runs write under tmp_path, as they would under
    # runs/lessons/ in the checkout; 1 thread per process.
    monkeypatch.setenv("LAB_LESSON_RUNS", str(tmp_path / "lessons"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = NotebookClient(notebook, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert printed.count("as expected: ") == sum(c.source.count("lesson.expect(") for c in checks)
    assert any(o.output_type == "display_data" for o in outputs), "the lesson shows no table or plot inline"


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_make_notebook_leaves_the_lesson_files_as_committed(path):
    """`make notebook` pairs each .py with its .ipynb (jupytext --sync), rewriting the .py in jupytext's own form:
    a lesson committed in another form would show as changed in every learner's checkout."""
    import jupytext

    assert jupytext.writes(jupytext.read(path), fmt="py:percent") == path.read_text()
