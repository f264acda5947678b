"""`make setup` picks a torch the host's NVIDIA driver runs. No GPU here: nvidia-smi is a stand-in on PATH that
prints a driver version as `nvidia-smi --query-gpu=driver_version --format=csv,noheader` does (say so); the script
and the table are the lab's own. And `lab doctor` names a driver too old for torch's CUDA, with the fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.machine.health import doctor_torch, driver
from tests.unit.test_doctor_fabric import node, smi_q

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch_for_driver.py"


def _with_driver(tmp_path: Path, version: str | None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if version is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{version}'\n")
        smi.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"  # no other nvidia-smi: /usr/local/bin and the like left out
    return subprocess.run(
        ["/usr/bin/python3", str(SCRIPT), str(ROOT / "constraints.txt")],
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _pin(text: str, name: str) -> str:
    return re.search(rf"^{name}==(\S+)", text, re.M).group(1)  # type: ignore[union-attr]


def test_driver_550_gets_the_newest_cuda_12_torch_said_in_one_line(tmp_path):
    done = _with_driver(tmp_path, "550.54.15")
    assert done.returncode == 0
    assert (_pin(done.stdout, "torch"), _pin(done.stdout, "torchvision")) == ("2.10.0", "0.25.0")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        "make setup: NVIDIA driver 550.54.15 runs CUDA 12 wheels, not torch 2.14.1's CUDA 13"
    )
    rest = [line for line in done.stdout.splitlines() if not line.startswith(("torch==", "torchvision=="))]
    kept = [
        line
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if not line.startswith(("torch==", "torchvision=="))
    ]
    assert rest == kept  # every other pin as it was


@pytest.mark.parametrize("version", ["580.95.05", None])
def test_a_new_enough_driver_or_no_driver_keeps_the_pinned_torch_and_says_nothing(tmp_path, version):
    done = _with_driver(tmp_path, version)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == (ROOT / "constraints.txt").read_text()


def test_a_driver_older_than_any_wheel_is_refused_in_one_line_naming_what_to_do(tmp_path):
    done = _with_driver(tmp_path, "470.256.02")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "NVIDIA driver 470.256.02 runs no torch wheel the lab supports" in done.stderr
    assert "upgrade the driver, or use the lab image" in done.stderr


def test_the_table_names_the_pinned_torch_and_make_setup_reads_the_picked_constraints():
    constraints = (ROOT / "constraints.txt").read_text()
    assert driver.WHEELS[0][:2] == (_pin(constraints, "torch"), _pin(constraints, "torchvision"))
    dry = subprocess.run(
        ["make", "-n", "-B", "setup", "PYTHON=python3"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    assert "scripts/torch_for_driver.py constraints.txt > .venv/constraints.txt" in dry
    assert dry.count("-c .venv/constraints.txt") == 2 and " -c constraints.txt" not in dry


def test_the_doctor_names_a_driver_too_old_for_torchs_cuda_with_the_fix(tmp_path):
    error = "CUDA error 35: CUDA driver version is insufficient for CUDA runtime version"
    check, _ = doctor_torch.check_unusable_gpus("13.0", error, node(tmp_path, smi_q("N/A", gpus=2), (3, "x\n"), 0))
    assert check.verdict == "failed"
    assert "driver 550.54.15 is older than CUDA 13.0 needs (580.65.6 or newer)" in check.detail
    assert check.fix.startswith("install torch 2.10.0 (built for CUDA 12, which this driver runs; make setup picks it)")


if sys.platform != "linux":
    pytestmark = pytest.mark.skip(reason="a POSIX shell stand-in for nvidia-smi")
