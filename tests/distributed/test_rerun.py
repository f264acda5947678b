"""`lab rerun`: real runs trained again from their records, through the real command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import TINY, lab, metrics
from tests.distributed.conftest import ONE_THREAD

# 256 images at a global batch of 64: 8 steps over 2 epochs, a row per step, an evaluation per epoch.
# One thread (ONE_THREAD); the rerun takes it from the record.
RECORD = [
    *TINY,
    "--set",
    "run.deterministic=true",
    "--set",
    "data.synthetic_train_size=256",
    "--set",
    "data.synthetic_test_size=128",
    "--set",
    "train.log_every=1",
    "--set",
    "checkpoint.save=false",
]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> Path:
    """A deterministic 1-rank CPU run, the record the tests below rerun."""
    runs_dir = tmp_path_factory.mktemp("runs")
    lab("train", *RECORD, "--set", f"run.output_dir={runs_dir}", "--set", "run.id=one", env=ONE_THREAD)
    return runs_dir / "one"


def rerun(run_dir: Path, tmp_path: Path, *args: str):
    """`lab rerun` into tmp_path; (process, its JSON, the new run directory)."""
    out = tmp_path / "reruns"
    proc = lab(
        "rerun", str(run_dir), "--output-dir", str(out), "--json", str(tmp_path / "rerun.json"), *args, check=False
    )
    assert proc.returncode in (0, 3), f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads((tmp_path / "rerun.json").read_text())
    new_dir = Path(result["rerun"])
    assert new_dir.parent == out and new_dir.name.startswith(f"{run_dir.name}-rerun-")
    return proc, result, new_dir


def test_a_deterministic_run_reruns_bit_identically(one_rank, tmp_path):
    proc, result, new_dir = rerun(one_rank, tmp_path)
    assert proc.returncode == 0 and "bit-identical" in proc.stdout
    assert result["identical"] and result["max_relative_difference"] == 0 and result["deterministic"]
    assert result["steps_compared"] == 8 and result["version_warnings"] == []
    assert [r["loss"] for r in metrics(new_dir)] == [r["loss"] for r in metrics(one_rank)]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| 8 | bit-identical | 0 |")  # the table comes last


def test_a_two_rank_torchrun_run_reruns_bit_identically(deterministic_two_ranks, tmp_path):
    # The session's deterministic 2-rank run (tests/distributed/conftest.py): 12 steps, each compared.
    proc, result, new_dir = rerun(deterministic_two_ranks, tmp_path)
    assert proc.returncode == 0 and result["identical"] and result["steps_compared"] == 12
    assert "--nproc-per-node 2" in proc.stdout  # the rerun ran under torchrun with the recorded world size
    assert json.loads((new_dir / "manifest.json").read_text())["world_size"] == 2


def test_a_changed_seed_is_reported_as_different_with_exit_3(one_rank, tmp_path):
    proc, result, _ = rerun(one_rank, tmp_path, "--set", "run.seed=1")
    assert proc.returncode == 3, proc.stdout[-2000:]
    assert "differs" in proc.stdout and "did not reproduce" in proc.stdout
    assert not result["identical"] and result["max_relative_difference"] > 0 and 1 <= result["at_step"] <= 8


def test_steps_reruns_and_compares_only_the_first_n_steps(one_rank, tmp_path):
    proc, result, new_dir = rerun(one_rank, tmp_path, "--steps", "3")
    assert proc.returncode == 0 and result["identical"] and result["steps_compared"] == 3
    rows, recorded = metrics(new_dir), metrics(one_rank)
    assert [r["step"] for r in rows] == [1, 2, 3] and metrics(new_dir, "eval") == []
    # stopped, not shortened: the learning-rate schedule is the record's, so the rows are the same numbers
    assert [(r["loss"], r["lr"], r["total_steps"]) for r in rows] == [
        (r["loss"], r["lr"], r["total_steps"]) for r in recorded[:3]
    ]
    assert json.loads((new_dir / "summary.json").read_text())["status"] == "stopped"


def _bad(run_dir: Path) -> str:
    proc = lab("rerun", str(run_dir), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_bad_records_exit_2_with_one_line(one_rank, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "manifest.json: not found" in _bad(tmp_path / "empty")

    broken = Path(shutil.copytree(one_rank, tmp_path / "broken"))
    manifest = json.loads((broken / "manifest.json").read_text())
    (broken / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if k != "config"}))
    assert "manifest.json: missing or malformed key(s) config" in _bad(broken)

    # A record of real CIFAR-10 cannot be rerun where those files are not.
    cifar = Path(shutil.copytree(one_rank, tmp_path / "cifar"))
    manifest["data"] = {**manifest["data"], "source": "cifar10", "description": "CIFAR-10 (50000 train)"}
    manifest["config"]["data"]["root"] = str(tmp_path / "no-data")
    (cifar / "manifest.json").write_text(json.dumps(manifest))
    assert "cifar-10-batches-py is not here" in _bad(cifar)
    assert not list((tmp_path / "cifar").parent.glob("cifar-rerun-*"))  # refused before anything was written
