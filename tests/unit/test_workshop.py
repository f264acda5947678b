"""The workshop end to end on a tiny config: real runs, benchmarks, a comparison and a report."""

from __future__ import annotations

import json
import os
import re

import pytest
from PIL import Image

from tests.conftest import lab
from tests.markdown import problems


EVERY_PART_BUT_PITFALLS = "training,allreduce,scaling,levers,memory,strategies"


def test_the_pitfalls_part_runs_lab_pitfall_for_each_lecture_pitfall(tmp_path):
    """The pitfalls part is four `lab pitfall NAME` commands, each run for real by tests/distributed/
    test_pitfalls.py (which also reports one); here, that the workshop plans exactly those. The run of every
    other part leaves it out, which keeps 50 s of CI for tests that check something new."""
    from pathlib import Path

    from lab import config, workshop

    steps = workshop.plan(config.load("smoke"), "smoke", [], [2, 4], 0, Path(tmp_path))
    pitfalls = [s.command for s in steps if s.part == "pitfalls"]
    assert [c[c.index("pitfall") + 1] for c in pitfalls] == ["set-epoch", "checkpoint-every-rank", "batchnorm",
                                                             "uneven-batches"]
    for command in pitfalls:
        assert command[command.index("--nproc-per-node") + 1] == "2" and command[-2] == "--json"


def test_workshop_runs_every_part_and_reports(tmp_path):
    # run.deterministic: the strategies step's curves can then be compared bit for bit (below).
    proc = lab("workshop", "--config", "smoke", "--output-dir", str(tmp_path), "--set", "model.width=8",
               "--set", "train.log_every=4", "--set", "run.deterministic=true", "--only", EVERY_PART_BUT_PITFALLS)
    [folder] = list(tmp_path.iterdir())
    result = json.loads((folder / "comparison.json").read_text())
    assert [result["runs"][name]["world_size"] for name in ("baseline", "ddp-2", "ddp-4")] == [1, 2, 4]
    # the baseline stopped at step 8 and resumed: its curve is whole, its log says where it resumed
    assert [r["step"] for r in result["loss_at_matching_steps"]] == [4, 8, 12, 16]
    assert "resuming from" in proc.stdout and "checkpoints/last.pt at step 8" in proc.stdout
    # Same global batch, same data order: the first interval's loss agrees closely even with BatchNorm.
    assert result["loss_at_matching_steps"][0]["max_relative_difference"] < 0.05
    assert "synthetic" in result["data"]
    assert "| step | baseline loss | DDP x2 loss | DDP x4 loss |" in proc.stdout
    assert (folder / "comparison.md").read_text().strip() in proc.stdout
    tour = json.loads((folder / "checkpoint.json").read_text())
    assert tour["progress"]["step"] == 8 and tour["loads_into_plain_model"] == "yes" and not tour["module_prefix"]
    assert {"model", "optimizer", "scheduler", "rng", "progress"} <= set(tour["parts"])

    for name in ("allreduce", "scaling-strong", "scaling-weak", "levers", "memory", "strategies"):
        assert json.loads((folder / f"{name}.json").read_text())["benchmark"] == name.split("-")[0]
    report = (folder / "report.md").read_text()
    assert f"report: {folder / 'report.md'}" in proc.stdout
    for section in ("## Training runs", "## Baseline and DDP at one global batch", "## The baseline's checkpoint",
                    "## All-reduce bus bandwidth", "## Strong scaling", "## Weak scaling", "## Levers",
                    "## Memory per device", "## Strategies side by side"):
        assert section in report
    assert problems(report) == []  # as GitHub and JupyterLab render it
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert set(images) == {"loss.png", "throughput.png", "allreduce.png", "scaling-strong.png", "scaling-weak.png",
                           "step-time-strong.png", "step-time-weak.png", "levers.png", "memory.png", "strategies.png"}
    for image in images:
        with Image.open(folder / image) as png:
            png.verify()  # a real PNG, not an empty file
    _strategies_shard_memory_and_agree_on_the_loss(json.loads((folder / "strategies.json").read_text()))
    _scaling_fits_both_laws(folder)


def test_workshop_runs_only_the_parts_asked_for(tmp_path):
    proc = lab("workshop", "--config", "smoke", "--output-dir", str(tmp_path), "--only", "memory")
    [folder] = list(tmp_path.iterdir())
    assert "== 1/2 memory" in proc.stdout and "== 2/2 report" in proc.stdout
    assert sorted(p.name for p in folder.glob("*.json")) == ["memory.json"]
    assert "## Memory per device" in (folder / "report.md").read_text()


def _scaling_fits_both_laws(folder):
    """Strong and weak scaling over 1, 2 and 4 processes on this CPU, each with its law fitted."""
    strong, weak = (json.loads((folder / f"scaling-{mode}.json").read_text()) for mode in ("strong", "weak"))
    assert [r["world_size"] for r in strong["rows"]] == [1, 2, 4] == [r["world_size"] for r in weak["rows"]]
    assert len({r["global_batch_size"] for r in strong["rows"]}) == 1
    assert [r["global_batch_size"] // r["world_size"] for r in weak["rows"]] == [64, 64, 64]
    for result, law in ((strong, "amdahl"), (weak, "gustafson")):
        fit = result[law]
        assert 0 <= fit["serial_fraction"] <= 1 and fit["residual_rms"] >= 0
        assert set(fit["projection"]) == {"8", "64", "512"}
        # processes past the cores are measured but not fitted
        assert fit["points"] == sum(not r["oversubscribed"] for r in result["rows"])

def _strategies_shard_memory_and_agree_on_the_loss(result):
    """The workshop's `lab bench strategies` step: DDP, FSDP and ZeRO-1/2/3 on 2 ranks, one torchrun job each."""
    rows = {r["label"]: r for r in result["rows"]}
    ddp, fsdp = rows["DDP"], rows["FSDP"]
    # Full sharding over 2 ranks halves parameters, gradients and optimizer state: exactly the estimate.
    for part in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes"):
        assert fsdp[part] < ddp[part]
    assert ddp["measured_over_estimate"] == pytest.approx(1.0, abs=0.01)
    assert fsdp["measured_over_estimate"] == pytest.approx(1.0, abs=0.02)  # shards round up to whole rows
    assert fsdp["loss_gap_from_ddp"] == 0.0  # deterministic CPU: the same sums in the same order
    zero = [rows[k] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3") if "error" not in rows[k]]
    if zero:  # with the [deepspeed] extra (make test installs it): memory falls stage by stage, curves agree
        assert [r["state_bytes"] for r in zero] == sorted((r["state_bytes"] for r in zero), reverse=True)
        assert zero[-1]["state_bytes"] < ddp["state_bytes"]
        assert all(r["loss_gap_from_ddp"] == 0.0 for r in zero)  # ZeRO-1, 2 and 3: DDP's curve bit for bit
    else:
        assert not os.environ.get("LAB_REQUIRE_DEEPSPEED"), {k: rows[k].get("error") for k in rows}
        assert all("not installed" in rows[k]["error"] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3"))
