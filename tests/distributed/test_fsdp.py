"""FSDP2 as a training strategy, for real under torchrun on gloo: the same curve as DDP, sharded checkpoints
that resume exactly (and at another world size), records and a report, and `lab bench strategies`."""

from __future__ import annotations

import json
import os

import pytest

from lab import compat
from tests.conftest import TINY, lab, metrics

pytestmark = pytest.mark.skipif(not compat.fsdp_runs_on_cpu(),
                                reason="FSDP2 on CPU tensors needs torch.cpu.Stream.record_event (torch > 2.6)")


def _curve(run_dir):
    return [(r["step"], r["loss"]) for r in metrics(run_dir)]


def _train(runs_dir, run_id, *extra, nproc="2"):
    args = ["train", *TINY, "--set", f"run.output_dir={runs_dir}", "--set", f"run.id={run_id}",
            "--set", "run.deterministic=true", "--set", "train.log_every=1", "--set", "train.epochs=1", *extra]
    return lab(*args, *(["--nproc-per-node", nproc] if nproc != "1" else []), env={"OMP_NUM_THREADS": "1"})


def test_fsdp_follows_ddp_and_resumes_exactly_from_its_sharded_checkpoint(runs_dir, tmp_path):
    _train(runs_dir, "ddp")
    _train(runs_dir, "fsdp", "--set", "dist.strategy=fsdp")
    # On CPU, deterministic: the same sums in the same order, so the curves are equal, not just close.
    assert _curve(runs_dir / "fsdp") == _curve(runs_dir / "ddp")

    _train(runs_dir, "parts", "--set", "dist.strategy=fsdp", "--set", "train.stop_after_steps=3")
    folder = runs_dir / "parts" / "checkpoints" / "fsdp"
    assert (folder / ".metadata").exists() and (folder / "trainer.pt").exists()
    assert sorted(p.name for p in folder.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]  # a shard per rank
    proc = _train(runs_dir, "parts", "--set", "dist.strategy=fsdp")
    assert "resuming from" in proc.stdout and "at step 3" in proc.stdout
    assert _curve(runs_dir / "parts") == _curve(runs_dir / "fsdp")

    # The same run id under DDP would start over beside the FSDP checkpoint: refused in one line.
    other = lab("train", *TINY, "--set", f"run.output_dir={runs_dir}", "--set", "run.id=parts", check=False)
    assert other.returncode == 2 and "a checkpoint of another dist.strategy than ddp" in other.stderr

    summary = json.loads((runs_dir / "parts" / "summary.json").read_text())
    manifest = json.loads((runs_dir / "parts" / "manifest.json").read_text())
    assert summary["status"] == "completed" and summary["strategy"] == manifest["strategy"] == "fsdp"
    assert manifest["fsdp_units"] == ["layer1", "layer2", "layer3", "layer4", "root"]
    report = lab("report", str(runs_dir / "parts"), "--out", str(tmp_path / "report"))
    assert "report:" in report.stdout and (tmp_path / "report" / "report.md").exists()


def test_an_fsdp_checkpoint_resumes_at_another_world_size(runs_dir):
    # GroupNorm: a rank's statistics do not depend on how the global batch is split, so 2 ranks then 1 follow
    # the 2-rank curve: the resumed step differs by rounding only (the all-reduce adds in another order than one
    # process's mean; measured 5e-8), then training amplifies that (measured 9e-4 eight steps later).
    group = ("--set", "dist.strategy=fsdp", "--set", "model.norm=group")
    _train(runs_dir, "two", *group)
    _train(runs_dir, "moved", *group, "--set", "train.stop_after_steps=3")
    proc = _train(runs_dir, "moved", *group, nproc="1")  # DCP re-shards the 2-rank checkpoint for one rank
    assert "resuming from" in proc.stdout and "at step 3" in proc.stdout
    two, moved = dict(_curve(runs_dir / "two")), dict(_curve(runs_dir / "moved"))
    assert two.keys() == moved.keys() == set(range(1, 9))
    assert all(two[s] == moved[s] for s in (1, 2, 3))                   # before the move: the same run
    assert abs(two[4] - moved[4]) / two[4] < 1e-6                         # weights and momentum came back whole
    assert max(abs(two[s] - moved[s]) / two[s] for s in two) < 1e-2    # then float32 drift, not a jump
    assert json.loads((runs_dir / "moved" / "summary.json").read_text())["world_size"] == 1


def test_strategies_side_by_side_shard_memory_and_agree_on_the_loss(tmp_path):
    out = tmp_path / "strategies.json"
    proc = lab("bench", "strategies", "--nproc-per-node", "2", "--steps", "4", "--set", "model.width=8",
               "--set", "run.deterministic=true", "--json", str(out), "--plot", str(tmp_path / "s.png"),
               env={"OMP_NUM_THREADS": "1"})
    rows = {r["label"]: r for r in json.loads(out.read_text())["rows"]}
    assert "| DDP |" in proc.stdout and (tmp_path / "s.png").stat().st_size > 10_000
    ddp, fsdp = rows["DDP"], rows["FSDP"]
    # Full sharding over 2 ranks halves parameters, gradients and optimizer state: exactly the estimate.
    for part in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes"):
        assert fsdp[part] < ddp[part]
    assert ddp["measured_over_estimate"] == pytest.approx(1.0, abs=0.01)
    assert fsdp["measured_over_estimate"] == pytest.approx(1.0, abs=0.02)  # shards round up to whole rows
    assert fsdp["loss_gap_from_ddp"] < 1e-6
    zero = [rows[k] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3") if "error" not in rows[k]]
    if zero:  # with the [deepspeed] extra (make test installs it): memory falls stage by stage, curves agree
        assert [r["state_bytes"] for r in zero] == sorted((r["state_bytes"] for r in zero), reverse=True)
        assert zero[-1]["state_bytes"] < ddp["state_bytes"]
        assert all(r["loss_gap_from_ddp"] < 1e-6 for r in zero)
    else:
        assert not os.environ.get("LAB_REQUIRE_DEEPSPEED"), {k: rows[k].get("error") for k in rows}
        assert all("not installed" in rows[k]["error"] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3"))
