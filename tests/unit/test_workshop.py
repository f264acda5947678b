"""The workshop end to end on a tiny config: real runs, benchmarks, a comparison and a report."""

from __future__ import annotations

import json
import os
import re

import pytest
from PIL import Image

from tests.conftest import lab
from tests.markdown import problems

# The parts run end to end below. The others are commands run for real elsewhere, each with its checks: the
# pitfalls by tests/distributed/test_pitfalls.py and lesson 2, all-reduce by test_benchmarks.py, scaling (both
# laws) and the levers by lesson 4 and test_levers.py, memory by lesson 5 and test_benchmarks.py (the lessons:
# tests/notebooks). Here, that the workshop plans exactly those commands; leaving their runs out keeps about
# 3 minutes of CI for tests that check something new.
RUN_PARTS = "training,strategies"


def test_the_parts_run_elsewhere_are_planned_as_the_commands_those_tests_run(tmp_path):
    from pathlib import Path

    from lab.course.teaching import workshop
    from lab.run import config

    steps = workshop.plan(config.load("smoke"), "smoke", [], [2, 4], 0, Path(tmp_path))
    commands = {
        part: [s.command for s in steps if s.part == part]
        for part in ("pitfalls", "allreduce", "scaling", "levers", "memory")
    }
    # DDP on 4 processes, which the run below leaves out (it trains DDP on 2): torchrun with 4, as ddp-4
    ddp = [
        s.command
        for s in steps
        if s.part == "training" and isinstance(s.command, list) and any("run.id=ddp-" in str(a) for a in s.command)
    ]
    assert [c[c.index("--nproc-per-node") + 1] for c in ddp] == ["2", "4"]
    assert "run.id=ddp-4" in ddp[1]
    pitfalls = commands["pitfalls"]
    assert [c[c.index("pitfall") + 1] for c in pitfalls] == [
        "set-epoch",
        "checkpoint-every-rank",
        "batchnorm",
        "uneven-batches",
    ]
    for command in pitfalls:
        assert command[command.index("--nproc-per-node") + 1] == "2" and command[-2] == "--json"
    [allreduce] = commands["allreduce"]
    target = allreduce.index("lab")  # after torchrun's own `-m lab.run.cluster.torchrun`
    assert allreduce[target - 1 : target + 3] == ["-m", "lab", "bench", "allreduce"]
    assert allreduce[-1] == str(tmp_path / "allreduce.json")
    for mode, command in zip(("strong", "weak"), commands["scaling"]):
        assert command[command.index("--mode") + 1] == mode and command[-1] == str(tmp_path / f"scaling-{mode}.json")
        assert command[command.index("--max-world-size") + 1] == "4"  # 1, 2 and 4 on a CPU: 4 is past 2 cores
    [levers] = commands["levers"]
    assert levers[levers.index("bench") + 1] == "levers" and levers[levers.index("--nproc-per-node") + 1] == "2"
    [memory] = commands["memory"]
    assert memory[memory.index("memory") : memory.index("--json")] == [
        "memory",
        "--params",
        "7e9",
        "--world-size",
        "8",
        "--device",
        "h100",
        "--measure",
    ]


@pytest.mark.torchrun  # DDP on 2 ranks and five strategy jobs: about 85 s of CI
def test_workshop_trains_compares_runs_the_strategies_and_reports(tmp_path):
    # run.deterministic: the strategies step's curves can then be compared bit for bit (below).
    proc = lab(
        "workshop",
        "--config",
        "smoke",
        "--output-dir",
        str(tmp_path),
        "--set",
        "model.width=8",
        "--set",
        "train.log_every=4",
        "--set",
        "run.deterministic=true",
        "--only",
        RUN_PARTS,
        "--nproc-per-node",
        "2",
    )  # DDP on 2 ranks only: lesson 1 and the workshop plan test cover the rest
    [folder] = list(tmp_path.iterdir())
    # --only: the parts asked for and the report, numbered among themselves (lab.course.teaching.workshop.parts: its
    # doctest)
    headers = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert headers[0].startswith("== 1/") and headers[-1] == f"== {len(headers)}/{len(headers)} report"
    assert not [h for h in headers if "pitfall" in h or "scaling" in h or "levers" in h or "all-reduce" in h]
    result = json.loads((folder / "comparison.json").read_text())
    assert [result["runs"][name]["world_size"] for name in ("baseline", "ddp-2")] == [1, 2]
    assert not (folder / "ddp-4").exists()
    # the baseline stopped at step 8 and resumed: its curve is whole, its log says where it resumed
    assert [r["step"] for r in result["loss_at_matching_steps"]] == [4, 8, 12, 16]
    assert "resuming from" in proc.stdout and "checkpoints/last.pt at step 8" in proc.stdout
    # Same global batch, same data order: the first interval's loss agrees closely even with BatchNorm.
    assert result["loss_at_matching_steps"][0]["max_relative_difference"] < 0.05
    assert "synthetic" in result["data"]
    assert "| step | baseline loss | DDP x2 loss |" in proc.stdout
    assert (folder / "comparison.md").read_text().strip() in proc.stdout
    tour = json.loads((folder / "checkpoint.json").read_text())
    assert tour["progress"]["step"] == 8 and tour["loads_into_plain_model"] == "yes" and not tour["module_prefix"]
    assert {"model", "optimizer", "scheduler", "rng", "progress"} <= set(tour["parts"])

    assert sorted(p.name for p in folder.glob("*.json")) == ["checkpoint.json", "comparison.json", "strategies.json"]
    assert json.loads((folder / "strategies.json").read_text())["benchmark"] == "strategies"
    report = (folder / "report.md").read_text()
    assert f"report: {folder / 'report.md'}" in proc.stdout
    for section in (
        "## Training runs",
        "## Baseline and DDP at one global batch",
        "## The baseline's checkpoint",
        "## Strategies side by side",
    ):
        assert section in report
    assert problems(report) == []  # as GitHub and JupyterLab render it
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert set(images) == {"loss.png", "throughput.png", "strategies.png"}
    for image in images:
        with Image.open(folder / image) as png:
            png.verify()  # a real PNG, not an empty file
    _strategies_shard_memory_and_agree_on_the_loss(json.loads((folder / "strategies.json").read_text()))


def _strategies_shard_memory_and_agree_on_the_loss(result):
    """The workshop's `lab bench strategies` step: DDP, FSDP, ZeRO-1/2/3 and Horovod on 2 ranks, one job each."""
    rows = {r["label"]: r for r in result["rows"]}
    ddp, fsdp = rows["DDP"], rows["FSDP"]
    # Full sharding over 2 ranks halves parameters, gradients and optimizer state: exactly the estimate.
    for part in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes"):
        assert fsdp[part] < ddp[part]
    assert ddp["measured_over_estimate"] == pytest.approx(1.0, abs=0.01)
    assert fsdp["measured_over_estimate"] == pytest.approx(1.0, abs=0.02)  # shards round up to whole rows
    # The estimate counts what each tool keeps (DeepSpeed's fp32 master partition, FSDP2's in-place shards):
    # every strategy measured within 5% of it (ZeRO-2 keeps whole gradients of the parameters its partition cuts)
    measured = {k: r["measured_over_estimate"] for k, r in rows.items() if "error" not in r}
    assert all(0.95 <= v <= 1.05 for v in measured.values()), measured
    assert all(r["bucket_bytes"] == 0 for r in (ddp, fsdp))  # DDP's buckets are its gradients; FSDP2 has none
    assert fsdp["loss_gap_from_ddp"] == 0.0  # deterministic CPU: the same sums in the same order
    zero = [rows[k] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3") if "error" not in rows[k]]
    if zero:  # with the [deepspeed] extra (make test installs it): memory falls stage by stage, curves agree
        assert [r["state_bytes"] for r in zero] == sorted((r["state_bytes"] for r in zero), reverse=True)
        assert zero[-1]["state_bytes"] < ddp["state_bytes"]
        assert all(r["loss_gap_from_ddp"] == 0.0 for r in zero)  # ZeRO-1, 2 and 3: DDP's curve bit for bit
        assert rows["ZeRO-3"]["bucket_bytes"] == rows["ZeRO-3"]["bucket_estimate_bytes"] == 25 * 2**20  # kept
    else:
        assert not os.environ.get("LAB_REQUIRE_DEEPSPEED"), {k: rows[k].get("error") for k in rows}
        assert all("not installed" in rows[k]["error"] for k in ("ZeRO-1", "ZeRO-2", "ZeRO-3"))
    horovod = rows["Horovod"]
    if "error" not in horovod:  # make test builds it (make horovod): a whole replica, DDP's curve bit for bit
        assert (horovod["state_bytes"], horovod["loss_gap_from_ddp"]) == (ddp["state_bytes"], 0.0)
        assert horovod["strategy"]["horovod_controller"] == "gloo"
    else:
        assert not os.environ.get("LAB_REQUIRE_HOROVOD") and "not installed" in horovod["error"], horovod
