"""A bare interpreter (tests/bare/sitecustomize.py): only torch, torchvision, PyYAML, numpy and what they require.

The GPU machines the lab borrows promise no more, so training must need no more; a command that needs an optional
package says which and how to install it, in one line (exit 2).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.conftest import ROOT, lab, run

BARE = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "bare"), os.environ.get("PYTHONPATH", "")])}

PROBE = """
import importlib.util, subprocess, sys
# lab's modules import without the extras
import torch, torchvision, yaml, numpy, lab, lab.plots, lab.run.observability.metrics
hidden = []
for name in ("matplotlib", "prometheus_client", "tqdm", "deepspeed", "pytest"):
    try:
        __import__(name)
    except ModuleNotFoundError as exc:
        hidden.append(exc.name)
print(" ".join(hidden))
print(importlib.util.find_spec("matplotlib"))          # torch probes optional packages this way too
child = subprocess.run([sys.executable, "-c", "import tqdm"], capture_output=True, text=True)
print(child.returncode, child.stderr.strip().splitlines()[-1])   # children inherit PYTHONPATH: bare too
"""


def test_the_bare_interpreter_hides_every_optional_package_and_keeps_torch_and_its_requirements():
    lines = run([sys.executable, "-c", PROBE], env=BARE).stdout.splitlines()
    assert lines == [
        "matplotlib prometheus_client tqdm deepspeed pytest",
        "None",
        "1 ModuleNotFoundError: No module named 'tqdm'",
    ]


@pytest.mark.slow  # a real run on the bare interpreter: about 5 s
def test_training_runs_on_a_bare_interpreter(tmp_path):
    lab(
        "train",
        "--config",
        "smoke",
        "--set",
        "train.max_steps=2",
        "--set",
        f"run.output_dir={tmp_path}",
        "--set",
        "run.id=bare",
        env=BARE,
    )
    summary = json.loads((tmp_path / "bare" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2


@pytest.mark.slow  # two lab commands on the bare interpreter: about 5 s
def test_a_command_that_needs_a_missing_package_names_it_and_the_pip_command_in_one_line(tmp_path):
    exporter = lab(
        "train",
        "--config",
        "smoke",
        "--set",
        "metrics.port_base=29911",
        "--set",
        f"run.output_dir={tmp_path}",
        env=BARE,
        check=False,
    )
    assert exporter.returncode == 2 and exporter.stderr.count("\n") == 1 and "Traceback" not in exporter.stderr
    assert "prometheus_client is not installed (pip install prometheus_client)" in exporter.stderr
    assert not list(tmp_path.glob("*/metrics.jsonl"))  # refused before training, not after
    figure = lab(
        "bench", "strategies", "--nproc-per-node", "2", "--plot", str(tmp_path / "s.png"), env=BARE, check=False
    )
    assert figure.returncode == 2 and figure.stderr.count("\n") == 1
    assert "matplotlib is not installed (pip install matplotlib)" in figure.stderr
    assert "lab.run.cluster.torchrun" not in figure.stdout  # refused before any job started


def test_on_a_terminal_without_tqdm_the_console_prints_lines_instead_of_a_bar(monkeypatch, capsys):
    from lab.run.training.console import Console

    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ModuleNotFoundError
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    console = Console()
    console.begin(total_steps=10)
    console.say("epoch 0 step 1/10")
    console.advance()
    assert capsys.readouterr().out == "epoch 0 step 1/10\n"
