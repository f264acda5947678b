"""FSDP2 as a training strategy, for real under torchrun on gloo: sharded checkpoints that resume exactly (and
at another world size), records and a report, accumulation equal to DDP's. That FSDP's and ZeRO's curves are
DDP's bit for bit, and their memory per rank, is asserted on the workshop's `lab bench strategies` step
(tests/unit/test_workshop.py), which runs them all. The optimizer a GPU run builds, and train.amp=bf16 with
BatchNorm: tests/distributed/test_strategies_as_on_cuda.py."""

from __future__ import annotations

import json

import pytest

from lab import compat
from tests.conftest import TINY, lab, metrics

pytestmark = pytest.mark.skipif(
    not compat.fsdp_runs_on_cpu(), reason="FSDP2 on CPU tensors needs torch.cpu.Stream.record_event (torch > 2.6)"
)


def _curve(run_dir):
    return [(r["step"], r["loss"]) for r in metrics(run_dir)]


def _train(runs_dir, run_id, *extra, nproc="2"):
    args = [
        "train",
        *TINY,
        "--set",
        f"run.output_dir={runs_dir}",
        "--set",
        f"run.id={run_id}",
        "--set",
        "run.deterministic=true",
        "--set",
        "train.log_every=1",
        "--set",
        "train.epochs=1",
        *extra,
    ]
    return lab(*args, *(["--nproc-per-node", nproc] if nproc != "1" else []), env={"OMP_NUM_THREADS": "1"})


def test_fsdp_resumes_exactly_from_its_sharded_checkpoint(runs_dir, tmp_path):
    # That FSDP's curve is DDP's, bit for bit, is asserted by the side-by-side test below.
    _train(runs_dir, "fsdp", "--set", "dist.strategy=fsdp")

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
    # channels_last too: FSDP2 refuses the NHWC conv weights it makes ("non-contiguous parameters"), found on an H200
    group = ("--set", "dist.strategy=fsdp", "--set", "model.norm=group", "--set", "model.channels_last=true")
    _train(runs_dir, "two", *group)
    _train(runs_dir, "moved", *group, "--set", "train.stop_after_steps=3")
    proc = _train(runs_dir, "moved", *group, nproc="1")  # DCP re-shards the 2-rank checkpoint for one rank
    assert "resuming from" in proc.stdout and "at step 3" in proc.stdout
    two, moved = dict(_curve(runs_dir / "two")), dict(_curve(runs_dir / "moved"))
    assert two.keys() == moved.keys() == set(range(1, 9))
    assert all(two[s] == moved[s] for s in (1, 2, 3))  # before the move: the same run
    assert abs(two[4] - moved[4]) / two[4] < 1e-6  # weights and momentum came back whole
    assert max(abs(two[s] - moved[s]) / two[s] for s in two) < 1e-2  # then float32 drift, not a jump
    assert json.loads((runs_dir / "moved" / "summary.json").read_text())["world_size"] == 1


def test_fsdp_with_accumulation_equals_ddp(runs_dir):
    # Between micro-batches FSDP neither reduce-scatters nor re-shards (lab/run/training/strategies/fsdp.py), like DDP's
    # no_sync: the gradient of the whole step is reduced once, so in float64 the two curves are the same.
    exact = (
        "--set",
        "train.grad_accum_steps=2",
        "--set",
        "model.norm=group",
        "--set",
        "model.dtype=float64",
        "--set",
        "train.max_steps=4",
    )
    _train(runs_dir, "ddp-accum", *exact)
    _train(runs_dir, "fsdp-accum", *exact, "--set", "dist.strategy=fsdp")
    assert _curve(runs_dir / "fsdp-accum") == _curve(runs_dir / "ddp-accum")
    assert len(_curve(runs_dir / "ddp-accum")) == 4
