"""dist.strategy=horovod through the real command line: `lab train --nproc-per-node 2` starts real horovodrun
(gloo) with the wheel `make horovod` built from the registry's sdist; `horovodrun -np 2 -H localhost:2 python
-m lab train` works as typed; the loss curve equals DDP's bit for bit (float64, GroupNorm, two micro-batches per
step: backward_passes_per_step against DDP's no_sync), across a stop and a resume; the timeline lands
in the run directory and `lab report` summarises it; what cannot run is refused in one line.

Measured here (CPU, run.deterministic=true): every train and test loss equals DDP's exactly, also in float32
with BatchNorm. Why it can: at 2 ranks Horovod's average (sum, then x 0.5) and DDP's (x 0.5, then sum) are
exact and a sum of two is the same in any order. The same held only after the strategy stopped calling
hvd.broadcast_optimizer_state on a fresh optimizer (its zero-gradient step moves weights under weight decay;
lab/run/training/strategies/horovod.py says more).

Horovod is built into .venv only (make horovod): the lowest-torch venv skips this module, saying so, unless
LAB_REQUIRE_HOROVOD=1 (make test's main run), where a missing Horovod fails.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import PYTHON, TINY, lab, metrics, require_horovod, run, torchrun

require_horovod()

EXACT = [
    "run.deterministic=true",
    "model.dtype=float64",
    "model.norm=group",
    "train.grad_accum_steps=2",
    "train.log_every=1",
    "train.epochs=1",
]
HOROVODRUN = str(Path(PYTHON).parent / "horovodrun")


def _sets(runs: Path, run_id: str, *extra: str) -> list[str]:
    out = []
    for item in (f"run.output_dir={runs}", f"run.id={run_id}", *EXACT, *extra):
        out += ["--set", item]
    return out


def _train(runs: Path, run_id: str, *extra: str, check: bool = True):
    return lab(
        "train", *TINY, "--nproc-per-node", "2", *_sets(runs, run_id, *extra), check=check, env={"OMP_NUM_THREADS": "1"}
    )


def _curves(run_dir: Path) -> tuple[list, list]:
    return (
        [(r["step"], r["loss"]) for r in metrics(run_dir)],
        [(r["step"], r["test_loss"]) for r in metrics(run_dir, "eval")],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """DDP on one config, 8 steps; Horovod on it stopped at step 5 by horovodrun as typed, then resumed by
    `lab train`: three jobs. Its curve must be DDP's over both parts, so the resume is exact too (the workshop's
    strategies row trains Horovod uninterrupted against DDP as well: tests/unit/test_workshop.py)."""
    runs = tmp_path_factory.mktemp("horovod") / "runs"
    _train(runs, "ddp")
    typed = run(
        [
            HOROVODRUN,
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--gloo",
            PYTHON,
            "-m",
            "lab",
            "train",
            *TINY,
            *_sets(runs, "horovod", "dist.strategy=horovod", "train.stop_after_steps=5"),
        ],
        env={"OMP_NUM_THREADS": "1"},
    )
    _train(runs, "horovod", "dist.strategy=horovod")
    return runs, typed


def test_horovodrun_as_typed_stops_and_lab_train_resumes_on_ddps_curve_bit_for_bit(runs):
    runs, typed = runs
    assert "run horovod stopped" in typed.stdout  # horovodrun's own prefixes ([0]<stdout>:) around the lab's lines
    ddp, horovod = _curves(runs / "ddp"), _curves(runs / "horovod")
    assert [s for s, _ in ddp[0]] == list(range(1, 9)) and len(ddp[1]) == 1
    assert horovod == ddp  # steps 1-5 from the first start, 6-8 from the checkpoint, and the test loss
    summary = json.loads((runs / "horovod" / "summary.json").read_text())
    manifest = json.loads((runs / "horovod" / "manifest.json").read_text())
    assert (summary["strategy"], summary["status"], manifest["world_size"]) == ("horovod", "completed", 2)
    assert (manifest["horovod_version"], manifest["horovod_controller"]) == ("0.28.1", "gloo")
    assert len(manifest["starts"]) == 2 and manifest["starts"][-1]["resumed_from"].endswith("last.pt")


def test_the_timeline_is_in_the_run_directory_and_the_report_summarises_its_phases(runs, tmp_path):
    runs, _ = runs
    events = (runs / "horovod" / "horovod-timeline.json").read_text()
    assert "NEGOTIATE_ALLREDUCE" in events and "GLOO_ALLREDUCE" in events
    lab("report", str(runs / "horovod"), "--out", str(tmp_path / "report"))
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Horovod timeline of horovod" in report
    rows = [line for line in report.splitlines() if line.startswith(("| NEGOTIATE_ALLREDUCE", "| GLOO_ALLREDUCE"))]
    # the resumed start's steps 6-8: 62 gradient tensors (ResNet-18) x 3 steps, each negotiated and reduced once
    assert len(rows) == 2 and all(" | 186 | " in line for line in rows), rows


# docs/horovod.md's two commands, run as typed from a folder whose .venv is this interpreter's
DOCUMENTED = [
    ".venv/bin/lab train --config smoke --set dist.strategy=horovod --nproc-per-node 2",
    ".venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m lab train --config smoke --set dist.strategy=horovod",  # noqa: E501 - as the docs type it
]


def test_the_documented_commands_train_as_typed(tmp_path):
    (tmp_path / ".venv").symlink_to(Path(PYTHON).parent.parent)
    for command in DOCUMENTED:
        proc = run(shlex.split(command), cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
        assert "x cpu (gloo), horovod, " in proc.stdout and " completed: test accuracy " in proc.stdout, command
    assert len(list((tmp_path / "runs").glob("*/horovod-timeline.json"))) == 2


def test_what_horovod_cannot_run_is_refused_in_one_line(tmp_path):
    compiled = _train(tmp_path, "c", "dist.strategy=horovod", "model.compile=true", check=False)
    assert compiled.returncode == 2 and "model.compile: true is not mapped" in compiled.stderr
    assert len(compiled.stderr.strip().splitlines()) == 1
    # torchrun would start world-size-1 Horovod copies: refused by every rank, printed once (by rank 0; the
    # failure table after it is torchrun's own)
    under_torchrun = torchrun(2, "-m", "lab", "train", *TINY, "--set", "dist.strategy=horovod", check=False)
    assert under_torchrun.returncode != 0
    assert under_torchrun.stderr.count("dist.strategy: horovod runs under horovodrun, not torchrun") == 1
    assert "Horovod sees rank" not in under_torchrun.stderr  # refused before any rank built a strategy
    # A Python where Horovod's torch part is missing (a package named horovod without it, first on the path)
    shadow = tmp_path / "shadow" / "horovod"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    missing = lab("train", *TINY, "--set", "dist.strategy=horovod", check=False, env={"PYTHONPATH": str(shadow.parent)})
    assert missing.returncode == 2 and "dist.strategy: horovod needs Horovod, not installed" in missing.stderr
    assert "third_party/horovod/build.sh" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
