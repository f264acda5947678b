"""dist.strategy=deepspeed through the real command line (`lab train --nproc-per-node 2`, real torchrun, gloo):
ZeRO-1, 2 and 3 give DDP's loss curve bit for bit, ZeRO-3 stops and resumes bit-identically, `lab report`
reads the run, and what DeepSpeed cannot honour is refused in one line.

Measured on CPU with run.deterministic=true and one micro-batch per step: every train loss and test loss
equals DDP's exactly (max difference 0.0). Why it can: at 2 ranks averaging is exact in float32 (x 0.5),
a sum of two is the same in any order, and SGD is elementwise, so flattening ZeRO's partitions changes
no rounding. Not asserted here: train.grad_accum_steps > 1 under ZeRO-2/3, which reduce every micro-batch
(sum of averages, not average of sums): the first update differs by an ulp, 3e-2 relative after 16 steps.

The DeepSpeed extra is installed by `make` into .venv only: elsewhere (the lowest-torch venv) this module
skips, saying so, unless LAB_REQUIRE_DEEPSPEED=1 (make test's main run), where a missing DeepSpeed fails.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import TINY, lab, metrics, require_deepspeed

require_deepspeed()

# ZeRO-1 and 2 train through the same engine; their curves are compared with DDP's, bit for bit, by
# tests/distributed/test_fsdp.py's side-by-side test (`lab bench strategies`). Here ZeRO-3, whose forward
# gathers parameters (evaluation included), against DDP on training and test losses.
STAGES = (3,)


def _train(runs, run_id: str, *sets: str, check: bool = True):
    args = [
        "train",
        *TINY,
        "--nproc-per-node",
        "2",
        "--set",
        f"run.output_dir={runs}",
        "--set",
        f"run.id={run_id}",
        "--set",
        "run.deterministic=true",
        "--set",
        "train.log_every=1",
        "--set",
        "train.epochs=1",
    ]
    for item in sets:
        args += ["--set", item]
    return lab(*args, check=check, env={"OMP_NUM_THREADS": "1"})


def _zero(stage: int) -> list[str]:
    return ["dist.strategy=deepspeed", f"dist.zero_stage={stage}"]


def _curve(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in metrics(run_dir)]


def _evals(run_dir) -> list[tuple[int, float]]:
    return [(r["step"], r["test_loss"]) for r in metrics(run_dir, "eval")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """DDP and ZeRO-3 on the same config, 8 steps, a loss row per step: one torchrun job each."""
    runs = tmp_path_factory.mktemp("deepspeed") / "runs"
    _train(runs, "ddp")
    for stage in STAGES:
        _train(runs, f"zero{stage}", *_zero(stage))
    return runs


def test_zero_3_gives_ddps_train_and_test_losses_bit_for_bit(runs):
    ddp = _curve(runs / "ddp")
    assert [s for s, _ in ddp] == list(range(1, 9))
    for stage in STAGES:
        run_dir = runs / f"zero{stage}"
        assert _curve(run_dir) == ddp, f"ZeRO-{stage}"
        # Evaluation runs the plain module: under ZeRO-3 its hooks gather the sharded parameters.
        assert _evals(run_dir) == _evals(runs / "ddp") and len(_evals(run_dir)) == 1, f"ZeRO-{stage}"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (summary["strategy"], summary["zero_stage"], summary["status"]) == ("deepspeed", stage, "completed")
    assert json.loads((runs / "ddp" / "summary.json").read_text())["strategy"] == "ddp"


def test_zero_3_stopped_and_resumed_continues_bit_identically(runs):
    _train(runs, "parts", *_zero(3), "train.stop_after_steps=5")  # mid-epoch
    folder = runs / "parts" / "checkpoints" / "deepspeed"  # `latest` names the tag folder of the last whole save
    assert (folder / "latest").read_text().strip() == "step5"
    shards = sorted(p.name for p in (folder / "step5").iterdir())
    assert "trainer.pt" in shards and sum("optim_states" in name for name in shards) == 2  # one per rank
    assert json.loads((runs / "parts" / "summary.json").read_text())["status"] == "stopped"

    proc = _train(runs, "parts", *_zero(3))  # same id: checkpoint.resume=auto finds checkpoints/deepspeed
    assert "resuming from" in proc.stdout and "at step 5" in proc.stdout
    assert _curve(runs / "parts") == _curve(runs / "zero3")  # steps 1-5, then 6-8 after the resume
    assert _evals(runs / "parts") == _evals(runs / "zero3")
    summary = json.loads((runs / "parts" / "summary.json").read_text())
    assert (summary["status"], summary["strategy"], summary["zero_stage"]) == ("completed", "deepspeed", 3)
    manifest = json.loads((runs / "parts" / "manifest.json").read_text())
    assert [s["step"] for s in manifest["starts"]] == [0, 5] and manifest["zero_stage"] == 3
    assert (folder / "latest").read_text().strip() == "step8" and not (folder / "step5").exists()


def test_lab_report_reads_a_deepspeed_run(runs, tmp_path):
    lab("report", str(runs / "zero3"), "--out", str(tmp_path / "rep"))
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "| zero3 | 2 | synthetic | cpu | 8 |" in report
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert images and all((tmp_path / "rep" / image).stat().st_size > 0 for image in images)


def test_a_checkpoint_of_another_world_size_is_refused_in_one_line(runs):
    # One process (a 1-rank group) on ZeRO-3's 2-rank checkpoint: the trainer's checks pass, the shards do not fit.
    proc = lab(
        "train",
        *TINY,
        "--set",
        f"run.output_dir={runs}",
        "--set",
        "run.id=zero3",
        "--set",
        "train.epochs=1",
        *_sets(_zero(3)),
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith("saved at world size 2, this run has 1; resume with the same --nproc-per-node")
    )


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("data.uneven=join", "data.uneven: join uses DDP's Join context"),
        ("dist.static_graph=true", "dist.static_graph: true is a DDP option"),
    ],
)
def test_what_deepspeed_cannot_honour_is_one_line_and_exit_2(tmp_path, setting, named):
    proc = lab("train", *TINY, "--set", f"run.output_dir={tmp_path}", *_sets([*_zero(3), setting]), check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert named in proc.stderr and "dist.strategy=deepspeed" in proc.stderr


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]
