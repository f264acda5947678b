"""A run is parsed and checked once: `lab train --nproc-per-node 2` loads its config, checks its rules and its layout
in the parent, writes the result with the run id into the run's config.json, and its two workers read that file.

The count is taken from outside the lab's code: a `sitecustomize` on PYTHONPATH (which torchrun's workers inherit)
wraps the config's loader and checks in every process and writes one line per call, naming the process. (Each
worker still computes its step plan from the file: that is arithmetic it trains by, not a check.)"""

from __future__ import annotations

import json
from collections import Counter

from tests.conftest import TINY, lab

SPY = """
import os
from lab.run import config
from lab.run.config import rules

def _spy(name, function):
    def counted(*args, **kwargs):
        with open(os.environ["LAB_TEST_CALLS"], "a") as f:
            f.write(f"{os.getpid()} {os.environ.get('LOCAL_RANK', 'parent')} {name}\\n")
        return function(*args, **kwargs)
    return counted

config.load = _spy("load", config.load)
rules.check = _spy("rules", rules.check)
rules.check_layout = config.check_layout = _spy("layout", rules.check_layout)
"""


def test_lab_train_nproc_per_node_checks_its_config_once_and_its_workers_read_the_resolved_file(tmp_path):
    (tmp_path / "spy").mkdir()
    (tmp_path / "spy" / "sitecustomize.py").write_text(SPY)
    calls = tmp_path / "calls.txt"
    proc = lab(
        "train",
        *TINY,
        "--set",
        "train.max_steps=2",
        "--set",
        f"run.output_dir={tmp_path / 'runs'}",
        "--nproc-per-node",
        "2",
        env={"PYTHONPATH": str(tmp_path / "spy"), "LAB_TEST_CALLS": str(calls)},
    )
    lines = [line.split() for line in calls.read_text().splitlines()]
    assert {who for _, who, _ in lines} == {"parent"}, lines  # no worker loaded or checked anything
    assert Counter(name for *_, name in lines) == {"load": 1, "rules": 1, "layout": 1}
    (run_dir,) = (tmp_path / "runs").iterdir()
    resolved = json.loads((run_dir / "config.json").read_text())
    assert resolved["run_id"] == run_dir.name and resolved["world_size"] == 2
    assert f"--resolved {run_dir / 'config.json'}" in proc.stdout + proc.stderr  # the torchrun line it printed
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["config"] == resolved["config"]
    assert manifest["config_origin"].endswith("smoke.yaml")
