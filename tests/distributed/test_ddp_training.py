"""Real DDP runs through the real command line: learning, resume, determinism, uneven inputs."""

from __future__ import annotations

import json
import socket

import torch

from tests.conftest import ROOT, TINY, TORCHRUN, lab, metrics, run, torchrun
from tests.distributed.conftest import DETERMINISTIC_TWO_RANKS, ONE_THREAD

WORKER = str(ROOT / "tests" / "distributed" / "worker.py")


def test_two_process_batchnorm_run_learns(runs_dir):
    proc = lab(
        "train",
        *TINY,
        "--nproc-per-node",
        "2",
        "--set",
        f"run.output_dir={runs_dir}",
        "--set",
        "run.id=learn",
        "--set",
        "data.synthetic_train_size=2048",
        "--set",
        "data.synthetic_test_size=512",
        "--set",
        "train.epochs=4",
        "--set",
        "train.warmup_steps=10",
        "--set",
        "train.log_every=8",
    )
    assert "-m lab.run.cluster.torchrun --standalone --nproc-per-node 2 -m lab train" in proc.stdout  # the line it ran
    run_dir = runs_dir / "learn"
    rows = metrics(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert rows[-1]["loss"] <= rows[0]["loss"] / 2, [r["loss"] for r in rows]
    assert summary["test_accuracy"] > 0.30
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["data_source"] == "synthetic"
    assert manifest["data"]["source"] == "synthetic" and manifest["backend"] == "gloo"
    assert len(manifest["ranks"]) == 2 and manifest["versions"]["torch"] == torch.__version__
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert {
        "step",
        "epoch",
        "loss",
        "lr",
        "samples_per_second",
        "step_time_seconds",
        "device_memory_allocated_bytes",
        "device_memory_peak_bytes",
    } <= set(rows[0])


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in metrics(run_dir)]


def test_stopped_and_resumed_run_continues_bit_identically(deterministic_two_ranks, runs_dir):
    # The whole run is the session's (tests/distributed/conftest.py): 12 steps, 4 an epoch; this one in two parts.
    args = ["train", *DETERMINISTIC_TWO_RANKS, "--set", f"run.output_dir={runs_dir}", "--set", "run.id=parts"]
    lab(*args, "--set", "train.stop_after_steps=6", env=ONE_THREAD)  # mid-epoch 2 of 3
    stopped = json.loads((runs_dir / "parts" / "summary.json").read_text())
    assert stopped["status"] == "stopped" and stopped["steps"] == 6
    proc = lab(*args, env=ONE_THREAD)  # same id: checkpoint.resume=auto picks up last.pt
    assert "resuming from" in proc.stdout and "at step 6" in proc.stdout

    whole, parts = _losses(deterministic_two_ranks), _losses(runs_dir / "parts")
    assert [s for s, _ in parts] == list(range(1, 13)) == [s for s, _ in whole]
    assert parts == whole  # bit-identical, before and after the resume
    assert json.loads((runs_dir / "parts" / "summary.json").read_text())["status"] == "completed"
    manifest = json.loads((runs_dir / "parts" / "manifest.json").read_text())
    assert [s["step"] for s in manifest["starts"]] == [0, 6]


def test_deterministic_single_process_runs_are_bit_identical(runs_dir):
    args = [
        "train",
        *TINY,
        "--set",
        f"run.output_dir={runs_dir}",
        "--set",
        "run.deterministic=true",
        "--set",
        "train.log_every=1",
        "--set",
        "train.max_steps=6",
    ]
    lab(*args, "--set", "run.id=a")
    lab(*args, "--set", "run.id=b")
    assert _losses(runs_dir / "a") == _losses(runs_dir / "b")


def test_uneven_inputs_with_join_keep_ranks_identical(tmp_path):
    # 193 samples over 2 ranks at 16 per rank: rank 0 has 7 batches per epoch, rank 1 has 6.
    overrides = [
        "data.uneven=join",
        "data.synthetic_train_size=193",
        "train.global_batch_size=32",
        "train.epochs=2",
        "train.log_every=3",
        "checkpoint.save=false",
    ]
    torchrun(2, WORKER, "fit", str(tmp_path), *overrides)
    rank0, rank1 = torch.load(tmp_path / "final0.pt"), torch.load(tmp_path / "final1.pt")
    assert rank0["step"] == rank1["step"] == 14
    for part in ("params", "momentum"):
        for name, value in rank0[part].items():
            assert torch.equal(value, rank1[part][name]), f"{part} {name} differs between ranks"
    rows = [r for r in json.loads((tmp_path / "rows0.json").read_text()) if r["kind"] == "eval"]
    assert [r["step"] for r in rows] == [7, 14] and rows[-1]["test_samples"] == 256


def test_a_torchrun_job_is_named_by_its_rendezvous_id_and_resumes_under_it(tmp_path):
    # What a restarted worker group sees: the same --rdzv-id, so the same run directory and checkpoint.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = [
        TORCHRUN,
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "job42",
        "-m",
        "lab",
        "train",
        *TINY,
        "--set",
        f"run.output_dir={tmp_path}",
    ]
    run([*launch, "--set", "train.stop_after_steps=3"], env={"OMP_NUM_THREADS": "1"})
    run_dir = tmp_path / "smoke-job42"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "stopped"
    again = run(launch, env={"OMP_NUM_THREADS": "1"})
    assert "at step 3" in again.stdout
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert [p.name for p in tmp_path.iterdir()] == ["smoke-job42"]
