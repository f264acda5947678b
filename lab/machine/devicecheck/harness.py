"""What the device check's steps share: the Harness (where to write, how big to run, the overrides every `lab
train` gets, the clock), the child each step starts within its limit and the deadline, a step's Outcome (a verdict
of lab.verdict), and the refusals (StepFailed, DeadlineCut, Terminated). The steps are in
lab.machine.devicecheck.train_steps (runs that train), lab.machine.devicecheck.bench_steps (measurements) and
lab.machine.devicecheck.predict_step; the plan in lab.machine.devicecheck.plan; their table and the command in
lab.machine.devicecheck.command.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.run.cluster import runner

TARGET_IMAGES_PER_SECOND = 60_000  # training images/s of full-width ResNet-18 at batch 512 on one H100/H200
TARGET_DATA_RATIO = 10.0  # the lab's data path over a DataLoader path (data alone)
TARGET_METRICS_OVERHEAD = 0.01
STEP_LIMIT = 300  # seconds: a step's own limit when its row names none
# kept back from a child's limit, so that stopping its process group (lab.run.cluster.runner) fits the deadline
STOP_SECONDS = runner.STOP_GRACE_SECONDS + runner.KILL_GRACE_SECONDS + 1
MIN_START_SECONDS = 5  # a child with less than this left is not started: it could not finish
SYNC_BATCHNORM_SYNC = "SyncBatchNorm syncs with the host: PyTorch's boolean-mask indexing in its forward"
# Where the preflight's message says how to get a missing package.
HOW_TO_GET = {
    "lightning": "pip install lightning==2.6.6",
    "prometheus_client": "pip install prometheus_client",
    "deepspeed": "pip install deepspeed, or its wheels in wheels/: docs/benchmarks.md, make gpu-check",
    "lab.measure.bench.train.lightning_peer": "`lab bench lightning` (lab/measure/bench/train/lightning_peer.py) is "
    "not in this "
    "checkout",
}


@dataclass
class Outcome:
    """One line of the check's table: a step's verdict (held, failed; not run when the deadline, --only or a
    missing package kept it from running; not applicable when this host's hardware cannot run it)."""

    step: str
    verdict: str  # one of lab.verdict.VERDICTS
    detail: str
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    by_deadline: bool = False  # cut or not started because the deadline was spent


class StepFailed(Exception):
    """A step's command failed or its result is wrong; the message says which and where its log is."""


class DeadlineCut(StepFailed):
    """The deadline stopped a step's child, or left too little to start it."""


class Terminated(BaseException):
    """SIGTERM reached the check: its children are stopped and what finished is written, as on Ctrl-C."""


@dataclass
class Harness:
    """What the steps share: where to write, how big to run, the overrides every `lab train` gets, the clock."""

    out: Path
    quick: bool
    gpu: bool
    gpus: int
    deadline_at: float = math.inf  # time.monotonic() by which the whole check must have ended
    step_limit: float = STEP_LIMIT  # the running step's own limit for each child it starts
    epochs: int = 3  # epochs the training step times (--epochs)

    @property
    def config(self) -> str:
        return "smoke" if self.quick else "workshop-gpu"

    @property
    def fast(self) -> list[str]:
        """--set arguments of the benchmarks that time the training step: the settings a GPU run uses.
        No model.compile: the data path and the exporter are measured as ratios within one run, which compile
        does not change, and each would pay its own cold inductor compile (about a minute, in its own process
        with its own shapes). The compile is measured once, where it is the point: DDP + compile."""
        sets = ["model.width=8"] if self.quick else ["train.amp=bf16", "model.channels_last=true"]
        return set_args(sets)

    @property
    def common(self) -> list[str]:
        if self.quick:
            return [
                "model.width=8",
                "data.source=synthetic",
                "data.synthetic_train_size=256",
                "data.synthetic_test_size=64",
                "train.global_batch_size=32",
            ]
        # batch 512 at lr 0.05: full-width ResNet-18 on the synthetic data diverged within 16 steps at 0.4 (the
        # linear rule from 1.6 at 2048, workshop-gpu's lr then), 0.2 and 0.1 on an H200, and learned at 0.05 (72.7%
        # test accuracy after 32 steps; BENCHMARKS.md, 2026-12-04). Since then workshop-gpu starts each residual
        # block as the identity (zero_init_residual), which the check inherits: smoother on the CPU at every lr
        # tried (2026-12-07), not yet run on a GPU. Each step's run must learn (check_learned).
        return [
            "data.source=synthetic",
            "data.synthetic_train_size=16384",
            "data.synthetic_test_size=2048",
            "train.global_batch_size=512",
            "train.lr=0.05",
            "train.warmup_steps=12",
            "train.amp=bf16",
            "model.channels_last=true",
        ]

    @property
    def short(self) -> list[str]:
        """A dozen steps, logged every 4; at toy sizes 4 steps of 16 (bf16 on a CPU is ten times slower)."""
        if self.quick:
            return ["train.max_steps=4", "train.log_every=2", "train.global_batch_size=16"]
        return ["train.max_steps=12", "train.log_every=4"]

    def seconds_left(self) -> float:
        return self.deadline_at - time.monotonic()

    def lab(self, log: str, *argv: str) -> None:
        """`python -m lab ARGV` with its output in OUT/LOG.log; StepFailed when it exits non-zero."""
        self.child(log, [sys.executable, "-m", "lab", *argv])

    def bench(self, name: str, *argv: str, log: str | None = None, result: str | None = None) -> dict[str, Any]:
        """`lab bench NAME ARGV --json OUT/RESULT` (default NAME.json; its output in OUT/LOG.log, default NAME.log)
        and the result it wrote: every step that measures calls its benchmark this one way. A last check's result
        is removed first, so it never stands in for this one's."""
        path = self.out / (result or f"{name}.json")
        path.unlink(missing_ok=True)
        self.lab(log or name, "bench", name, *argv, "--json", str(path))
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded

    def child(self, log: str, command: list[str]) -> None:
        """Run `command` with its output in OUT/LOG.log, within min(the step's limit, the deadline's rest)."""
        limit = min(self.step_limit, self.seconds_left() - STOP_SECONDS)
        if limit < MIN_START_SECONDS:
            raise DeadlineCut(f"not started: {max(self.seconds_left(), 0):.0f} s of the deadline left")
        path = self.out / f"{log}.log"
        with open(path, "w") as f:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            # The runner stops the child's whole process group (torchrun's workers hold GPUs and NCCL) on its
            # time limit, and on Ctrl-C or SIGTERM, which end the check (Terminated) once the group is gone.
            done = runner.run(command, stdout=f, stderr=subprocess.STDOUT, timeout_seconds=limit, echo=False)
        if done.timed_out:
            if limit < self.step_limit:
                raise DeadlineCut(f"cut by the deadline after {limit:.0f} s; see {path}")
            raise StepFailed(f"no result within its {self.step_limit:.0f} s; see {path}")
        code = done.returncode
        if code != 0:
            tail = path.read_text().strip().splitlines()[-1:] or [""]
            raise StepFailed(f"exit {code}: {tail[0][:160]}; see {path}")

    def train(self, log: str, run_id: str, *overrides: str) -> list[dict[str, Any]]:
        """`lab train` of the check's config with `overrides`; the run's train rows (last row per step)."""
        self.lab(
            log, "train", "--config", self.config, *set_args([*self.common, *self.runset_args(run_id), *overrides])
        )
        run_dir = self.out / "runs" / run_id
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary["status"] not in ("completed", "stopped"):
            raise StepFailed(f"run {run_id} ended {summary['status']}")
        rows = {}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["kind"] == "train":
                rows[row["step"]] = row
        losses = [rows[s]["loss"] for s in sorted(rows)]
        if not all(map(math.isfinite, losses)):
            raise StepFailed(f"run {run_id}: losses not finite: {losses}")
        if not self.quick:  # at toy sizes a few steps prove the path, not learning: the CPU tests assert that
            check_learned(run_id, losses)
        return [rows[s] for s in sorted(rows)]

    def runset_args(self, run_id: str) -> list[str]:
        """Where a run's records go (inside OUT) and no exporter (workshop-gpu has one; the check needs none)."""
        return [f"run.output_dir={self.out / 'runs'}", f"run.id={run_id}", "metrics.port_base=0"]

    def manifest(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.out / "runs" / run_id / "manifest.json").read_text())

    def backend(self, run_id: str) -> str:
        """The run's process-group backend, which must be NCCL on a GPU (gloo on the CPU)."""
        backend = self.manifest(run_id)["backend"]
        if backend != ("nccl" if self.gpu else "gloo"):
            raise StepFailed(f"the process group used {backend}, not {'nccl' if self.gpu else 'gloo'}")
        return backend


def check_learned(run_id: str, losses: list[float]) -> None:
    """A run that trained without learning proves nothing about its path: its last logged loss must be below its
    first. (The first GPU run of this check passed bf16, DDP and resume on runs whose loss went 2.9 -> 9.9 -> 5.8.)

    >>> check_learned("bf16", [2.45, 2.40, 2.31])
    >>> check_learned("bf16", [2.945, 9.923, 5.826])
    Traceback (most recent call last):
    ...
    lab.machine.devicecheck.harness.StepFailed: run bf16 did not learn: loss 2.945 -> 5.826 (logged: 2.945, 9.923,
    5.826)
    """
    if len(losses) >= 2 and not losses[-1] < losses[0]:
        logged = ", ".join(f"{x:.3f}" for x in losses[:8])
        raise StepFailed(f"run {run_id} did not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f} (logged: {logged})")


def set_args(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def mark(ok: bool) -> str:
    """A target's verdict in a step's line."""
    return "met" if ok else "missed"
