"""lab/frozen_imports.py in fresh interpreters. In the lab's own program torch's import-time objects are frozen,
torch works as before, and a cycle the process makes after the import is still collected and finalised. Anyone else's
program that imports lab (here `python -c`, as a learner's script or a kernel would) is left alone: its globals,
made before the import, are finalised at exit (a global open file keeps what was written to it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LAB_ITSELF = """
import gc, importlib.resources, lab.frozen_imports
assert lab.frozen_imports.install(["python", "-m", "lab", "train"]) {off}
import torch
assert torch.ones(3).sum().item() == 3.0 and importlib.resources.files("torch").is_dir()

class Cycle:  # a run's object made after the import, in a cycle: only the collector finalises it
    def __init__(self):
        self.me = self
    def __del__(self):
        print("finalised", flush=True)

def run():
    Cycle()
    print(gc.get_freeze_count(), flush=True)

run()
"""

SOMEONES_SCRIPT = """
import gc
log = open({path!r}, "w")  # a global file never closed: Python flushes it at exit by clearing __main__
import lab, torch, torchvision
log.write("kept")
print(gc.get_freeze_count(), flush=True)
"""


def _python(code: str, **env: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


@pytest.mark.parametrize("off", [False, True])
def test_in_the_labs_program_torchs_objects_are_frozen_and_a_later_cycle_is_still_finalised(off):
    frozen, finalised = _python(
        LAB_ITSELF.format(off="is False" if off else "is True"), LAB_FREEZE_IMPORTS="0" if off else "1"
    )
    assert (int(frozen) == 0) if off else (int(frozen) > 100_000), frozen  # torch's import leaves ~300,000
    assert finalised == "finalised"


def test_someone_elses_program_importing_lab_is_left_alone_and_its_global_file_is_flushed(tmp_path):
    path = tmp_path / "log.txt"
    (frozen,) = _python(SOMEONES_SCRIPT.format(path=str(path)))
    assert int(frozen) == 0 and path.read_text() == "kept"


def test_the_console_script_is_the_labs_program_and_python_c_is_not(tmp_path):
    """As the interpreter records its command line (sys.orig_argv); `-m lab ...` is the doctest's."""
    code = "import sys, lab.frozen_imports as f; print(f.lab_is_main(sys.orig_argv))"
    script = tmp_path / "lab"  # what `lab ...` runs: .venv/bin/lab
    script.write_text(code)
    assert _python(code) == ["False"]
    assert subprocess.run([sys.executable, str(script)], capture_output=True, text=True).stdout.split() == ["True"]


def test_anyones_script_under_lab_launch_is_left_alone_and_its_global_file_is_flushed(tmp_path):
    """`lab launch -- SCRIPT.py` runs each rank as lab.run.cluster.watched, a lab program that calls leave_alone
    before the script (the grader's lab.course.exercises.observe does the same)."""
    script, path = tmp_path / "someone.py", tmp_path / "log.txt"
    script.write_text(SOMEONES_SCRIPT.format(path=str(path)))
    watched = [sys.executable, "-m", "lab.run.cluster.watched", "--hang-seconds", "30", "--stop-seconds", "60", "--"]
    out = subprocess.run([*watched, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["0"] and path.read_text() == "kept"
