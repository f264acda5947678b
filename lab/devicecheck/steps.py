"""The device check's steps: what each runs (a real `lab` command in a child, or a measurement in
lab.devicecheck.measure's child, each through lab.cluster.runner, which stops its process group on its time
limit, the deadline or a signal), and the outcome each reports.

`lab.devicecheck.command` holds the table that orders them, the plan, the deadline and the command; a step here
knows only its Check (where to write, how big, how long its child may take).
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

from lab.cluster import runner

TARGET_IMAGES_PER_SECOND = 60_000  # training images/s of full-width ResNet-18 at batch 512 on one H100/H200
TARGET_DATA_RATIO = 10.0  # the lab's data path over a DataLoader path (data alone)
TARGET_METRICS_OVERHEAD = 0.01
STEP_LIMIT = 300  # seconds: a step's own limit when its row names none
# kept back from a child's limit, so that stopping its process group (lab.cluster.runner) fits the deadline
STOP_SECONDS = runner.STOP_GRACE_SECONDS + runner.KILL_GRACE_SECONDS + 1
MIN_START_SECONDS = 5  # a child with less than this left is not started: it could not finish
SYNC_BATCHNORM_SYNC = "SyncBatchNorm syncs with the host: PyTorch's boolean-mask indexing in its forward"
# Where the preflight's message says how to get a missing package.
HOW_TO_GET = {
    "lightning": "pip install lightning==2.6.6",
    "prometheus_client": "pip install prometheus_client",
    "deepspeed": "pip install deepspeed, or its wheels in wheels/: docs/benchmarks.md, make gpu-check",
    "lab.bench.train.lightning_peer": "`lab bench lightning` (lab/bench/train/lightning_peer.py) is not in this "
    "checkout",
}


@dataclass
class Outcome:
    step: str
    status: str  # passed | failed | skipped
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
class Check:
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
        return _sets(sets)

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
        # linear rule from workshop-gpu's 1.6 at 2048), 0.2 and 0.1 on an H200, and learned at 0.05 (72.7% test
        # accuracy after 32 steps; BENCHMARKS.md, 2026-12-04). Each step's run must learn (check_learned).
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

    def train(self, log: str, run_id: str, *overrides: str) -> list[dict]:
        """`lab train` of the check's config with `overrides`; the run's train rows (last row per step)."""
        self.lab(log, "train", "--config", self.config, *_sets([*self.common, *self.run_sets(run_id), *overrides]))
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

    def run_sets(self, run_id: str) -> list[str]:
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
    lab.devicecheck.steps.StepFailed: run bf16 did not learn: loss 2.945 -> 5.826 (logged: 2.945, 9.923, 5.826)
    """
    if len(losses) >= 2 and not losses[-1] < losses[0]:
        logged = ", ".join(f"{x:.3f}" for x in losses[:8])
        raise StepFailed(f"run {run_id} did not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f} (logged: {logged})")


def _sets(overrides: list[str]) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def _losses(rows: list[dict]) -> str:
    return f"{rows[-1]['step']} steps, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}"


def _bf16(c: Check, run_id: str) -> None:
    amp = c.manifest(run_id)["amp"]
    if amp != "bfloat16":
        raise StepFailed(f"run {run_id} trained with amp {amp}, not bfloat16")


# ----------------------------------------------------------------------------- the steps


def doctor(c: Check) -> Outcome:
    c.lab("doctor", "doctor", "--json", str(c.out / "doctor.json"), "--output-dir", str(c.out))
    checks = json.loads((c.out / "doctor.json").read_text())["checks"]
    warned = [k["name"] for k in checks if k["status"] != "ok"]
    return Outcome("doctor", "passed", f"{len(checks)} checks" + (f"; not ok: {', '.join(warned)}" if warned else ""))


def fsdp(c: Check) -> Outcome:
    """FSDP2 with bf16 on one rank: the fused optimizer on DTensors and BatchNorm under the mixed-precision
    policy are the two ways it broke on CUDA; both show in the first step."""
    rows = c.train("fsdp", "fsdp", "dist.strategy=fsdp", "train.amp=bf16", *c.short, "checkpoint.save=false")
    backend = c.backend("fsdp")
    _bf16(c, "fsdp")
    return Outcome("FSDP", "passed", f"{backend} process group of 1, FSDP2 fully_shard, bf16: {_losses(rows)}")


def bf16_training(c: Check) -> Outcome:
    rows = c.train("bf16", "bf16", "train.amp=bf16", *c.short, "checkpoint.save=false")
    _bf16(c, "bf16")
    return Outcome("bf16 training", "passed", f"bf16 autocast, no process group: {_losses(rows)}")


def one_rank_ddp(c: Check, compiled: bool) -> Outcome:
    name = "DDP + compile" if compiled else "DDP, 1 rank"
    run_id = "ddp-1rank-compiled" if compiled else "ddp-1rank"
    extra = ["model.compile=true", "dist.static_graph=true"] if compiled else ["train.grad_accum_steps=2"]
    rows = c.train(run_id, run_id, "dist.single_process_group=true", *c.short, "checkpoint.save=false", *extra)
    backend = c.backend(run_id)
    what = "torch.compile (DDPOptimizer), static_graph" if compiled else "gradient accumulation 2 (no_sync)"
    return Outcome(name, "passed", f"{backend} process group of 1, DDP, {what}: {_losses(rows)}")


# name, overrides of one guarded run of the host-syncs step. SyncBatchNorm needs a process group (1 rank here).
HOST_SYNC_VARIANTS = (
    ("bf16", "train.amp=bf16"),
    ("fp16", "train.amp=fp16"),
    ("sync_batchnorm", "train.amp=bf16,model.sync_batchnorm=true,dist.single_process_group=true"),
)


def host_syncs(c: Check) -> Outcome:
    """Training steps with CUDA's sync debug mode set to error: any host sync between log intervals raises.
    Under bf16, and under fp16, whose GradScaler would read found-inf back every step if the optimizer
    could not take it on the device (the fused SGD does). Then once with SyncBatchNorm, whose sync is
    PyTorch's own: the check shows it (expected), as the config's help and the run's first lines say."""
    steps = 12
    # 32 batches of 256: no epoch boundary inside the guarded steps
    sets = [*c.common, "data.synthetic_train_size=8192", "train.global_batch_size=256"]
    variants = [x for name, overrides in HOST_SYNC_VARIANTS for x in ("--variant", f"{name}:{overrides}")]
    c.child(
        "host-syncs",
        [
            sys.executable,
            "-m",
            "lab.devicecheck.measure",
            "host-syncs",
            "--config",
            c.config,
            *_sets(sets),
            "--steps",
            str(steps),
            *variants,
            "--json",
            str(c.out / "host-syncs.json"),
        ],
    )
    found = json.loads((c.out / "host-syncs.json").read_text())["variants"]
    synced = {name: sync for name, sync in found.items() if sync and name != "sync_batchnorm"}
    if synced:
        raise StepFailed(
            "; ".join(f"{name}: a host sync inside the step loop: {sync}" for name, sync in synced.items())
        )
    bn = found.get("sync_batchnorm")
    shown = (
        f"{SYNC_BATCHNORM_SYNC} (expected: {bn[:60]})"
        if bn
        else "SyncBatchNorm: no host sync found, where PyTorch's boolean-mask indexing had one (torch changed?)"
    )
    return Outcome(
        "host syncs",
        "passed",
        f"bf16, fp16: none in {steps} steps under set_sync_debug_mode('error'); {shown}",
        figures=found,
    )


def host_device(c: Check) -> Outcome:
    """`lab bench hostdevice` on this host's GPUs: pinned copies both ways per GPU and the GPU-to-GPU matrix, the
    figures `lab validate` judges (the CPU tests run the same code host to host, unpinned)."""
    path = c.out / "hostdevice.json"
    path.unlink(missing_ok=True)  # a last check's figures must not stand in for this one's
    c.lab(
        "hostdevice",
        "bench",
        "hostdevice",
        "--size",
        "64M" if c.quick else "256M",
        "--iters",
        "5" if c.quick else "20",
        "--json",
        str(path),
    )
    r = json.loads(path.read_text())
    if r["device"] != "cuda" or not r["pinned"]:
        raise StepFailed(
            f"copies ran on {r['device']} with {'pinned' if r['pinned'] else 'pageable'} host memory, "
            f"not CUDA and pinned; see {c.out / 'hostdevice.log'}"
        )
    n, d2d = len(r["gpus"]), r["d2d_gbps"]
    figures = [g[k] for g in r["gpus"] for k in ("h2d_gbps", "d2h_gbps")] + [v for row in d2d for v in row]
    if (
        n != c.gpus
        or len(d2d) != n
        or any(len(row) != n for row in d2d)
        or not all(math.isfinite(v) and v > 0 for v in figures)
    ):
        raise StepFailed(
            f"{n} GPU(s) and a {len(d2d)}-row matrix for {c.gpus} GPU(s), or a figure not a positive number: {figures}"
        )

    def span(values: list[float]) -> str:
        return f"{min(values):.1f}" if max(values) - min(values) < 0.05 else f"{min(values):.1f}-{max(values):.1f}"

    pairs = [d2d[i][j] for i in range(n) for j in range(n) if i != j]
    return Outcome(
        "host<->device",
        "passed",
        f"{n} GPU(s), pinned, {r['size_bytes'] / 2**20:g} MiB (GB/s): "
        f"host->device {span([g['h2d_gbps'] for g in r['gpus']])}, device->host "
        f"{span([g['d2h_gbps'] for g in r['gpus']])}, within a GPU {span([d2d[i][i] for i in range(n)])}"
        + (f", GPU to GPU {span(pairs)}" if pairs else ""),
        figures=r,
    )


def training(c: Check, epochs: int) -> Outcome:
    started = time.perf_counter()
    c.train("training", "training", f"train.epochs={1 if c.quick else epochs}", "checkpoint.save=false")
    summary = json.loads((c.out / "runs" / "training" / "summary.json").read_text())
    wall = time.perf_counter() - started
    return Outcome(
        "training",
        "passed",
        f"{summary['steps']} steps in {wall:.1f} s (process start included), "
        f"{summary['samples_per_second'] or 0:,.0f} images/s",
        figures=summary,
    )


def data_path(c: Check) -> Outcome:
    c.lab(
        "pipeline",
        "bench",
        "pipeline",
        "--config",
        c.config,
        *c.fast,
        "--batch-size",
        "64" if c.quick else "512",
        "--batches",
        "2" if c.quick else "50",
        "--rounds",
        "1" if c.quick else "3",
        "--num-workers",
        "0" if c.quick else "8",
        "--json",
        str(c.out / "pipeline.json"),
    )
    p = json.loads((c.out / "pipeline.json").read_text())
    data, step = p["data_ratio_lab_over_torchvision"], p["train_ratio_lab_over_torchvision"]
    images = p["median_images_per_second"]["lab_train"]
    detail = (
        f"data alone {data:.1f}x the DataLoader path "
        f"(target {TARGET_DATA_RATIO:.0f}x: {_mark(data >= TARGET_DATA_RATIO)}); "
        f"with the training step {step:.2f}x; {images:,.0f} training images/s"
    )
    if c.gpu and not c.quick:
        detail += f" (target {TARGET_IMAGES_PER_SECOND:,}: {_mark(images >= TARGET_IMAGES_PER_SECOND)})"
    return Outcome("data path", "passed", detail, figures=p)


def deterministic_and_resume(c: Check) -> list[Outcome]:
    """A: 8 steps. B: the same, stopped after 4 and resumed. B's first half must equal A's (determinism across
    processes), and its resumed half must equal A's too (resume)."""
    run = ["run.deterministic=true", "train.max_steps=8", "train.log_every=1", "model.compile=false"]
    a = [
        r["loss"]
        for r in c.train("deterministic", "deterministic-a", *run, "checkpoint.save=false", "checkpoint.resume=never")
    ]
    c.train("resume-stop", "deterministic-b", *run, "train.stop_after_steps=4", "checkpoint.resume=never")
    b = [r["loss"] for r in c.train("resume", "deterministic-b", *run)]
    resumed = json.loads((c.out / "runs" / "deterministic-b" / "summary.json").read_text())
    if resumed["steps"] != 8:
        raise StepFailed(f"the resumed run ended at step {resumed['steps']}, not 8")
    outcomes = []
    first = "passed" if a[:4] == b[:4] else "failed"
    outcomes.append(
        Outcome(
            "deterministic",
            first,
            "two runs, bit-identical losses over 4 steps"
            if first == "passed"
            else f"losses differ: {a[:4]} vs {b[:4]}",
        )
    )
    second = "passed" if len(b) == 8 and a[4:] == b[4:] else "failed"
    outcomes.append(
        Outcome(
            "resume",
            second,
            "stopped at step 4, resumed: steps 5-8 bit-identical to the run that was not stopped"
            if second == "passed"
            else f"losses differ: {a[4:]} vs {b[4:]}",
        )
    )
    return outcomes


def memory(c: Check) -> Outcome:
    """Model state measured like the estimate counts it: parameters, gradients and momentum, no activations."""
    from lab.sizing.memory import MEASURED_RECIPE, estimate

    c.child(
        "memory",
        [
            sys.executable,
            "-m",
            "lab.devicecheck.measure",
            "model-state",
            "--width",
            "8" if c.quick else "64",
            "--json",
            str(c.out / "memory.json"),
        ],
    )
    measured = json.loads((c.out / "memory.json").read_text())
    state, peak = measured["state_bytes"], measured["peak_bytes"]
    expected = estimate(measured["params"], 1, *MEASURED_RECIPE)[0]["total_bytes"]
    ratio = state / expected
    if not 0.95 <= ratio <= 1.10:  # allocator rounding and BatchNorm buffers only
        raise StepFailed(
            f"model state {state / 1e6:.1f} MB measured vs {expected / 1e6:.1f} MB estimated "
            f"(ratio {ratio:.2f}): the estimator is off"
        )
    return Outcome(
        "memory",
        "passed",
        f"model state {state / 1e6:.1f} MB measured / {expected / 1e6:.1f} MB "
        f"estimated = {ratio:.2f}; peak with activations and workspaces at batch 256: "
        f"{peak / 1e6:.0f} MB",
        figures={"state_bytes": state, "estimate_bytes": expected, "ratio": ratio, "peak_bytes": peak},
    )


def strategies(c: Check) -> Outcome:
    """DDP, FSDP, DeepSpeed ZeRO-1/2/3 and Horovod each train on this host's GPUs over NCCL with bf16 (FSDP's
    mixed-precision policy, DeepSpeed's own bf16, autocast under DDP and Horovod): what the CPU tests cannot run.
    DeepSpeed and Horovod are optional: a row whose package is missing says "not installed" and fails nothing."""
    table = c.out / "strategies.json"
    table.unlink(missing_ok=True)  # a last check's table must not stand in for this one's
    try:
        c.lab(
            "strategies",
            "bench",
            "strategies",
            "--nproc-per-node",
            str(c.gpus),
            "--steps",
            "4",
            "--set",
            "train.amp=bf16",
            "--json",
            str(table),
        )
    except DeadlineCut:
        raise
    except StepFailed:
        if not table.exists():
            raise  # it exits 1 when a row failed, after writing the table, which names each one
    rows = json.loads(table.read_text())["rows"]
    ran = [r for r in rows if "error" not in r]
    absent = [r["label"] for r in rows if "not installed" in r.get("error", "")]
    broken = [f"{r['label']}: {r['error'][:80]}" for r in rows if "error" in r and r["label"] not in absent]
    if broken or not ran:
        raise StepFailed("; ".join(broken) or "no strategy trained")
    state = ", ".join(f"{r['label']} {r['state_bytes'] / 2**20:.1f}" for r in ran)
    return Outcome(
        "strategies",
        "passed",
        f"{c.gpus} GPU(s), bf16: state per rank (MiB) {state}; largest loss gap "
        f"from DDP {max(r['loss_gap_from_ddp'] for r in ran):.1e}"
        + (f"; not installed: {', '.join(absent)}" if absent else ""),
        figures={"rows": rows},
    )


def levers(c: Check) -> Outcome:
    """The levers where they matter: fp16 with its GradScaler, CUDA peak memory, and NCCL's variables."""
    c.lab(
        "levers",
        "bench",
        "levers",
        "--nproc-per-node",
        str(c.gpus),
        "--steps",
        "5",
        "--rounds",
        "2",
        "--json",
        str(c.out / "levers.json"),
    )
    result = json.loads((c.out / "levers.json").read_text())
    groups = result["groups"]
    ratios = ", ".join(f"{r['label']} {r['ratio_to_plain']:.2f}x" for r in groups["precision"] if "ratio_to_plain" in r)
    difference = groups["accumulation"]["equivalence"]["max_parameter_difference"]
    nccl = groups["nccl"]
    sweep = (
        ", ".join(f"{r['label']} {r['ratio_to_default']:.2f}x" for r in nccl["rows"] if r.get("ratio_to_default"))
        if nccl.get("applicable")
        else f"NCCL sweep not applicable ({nccl.get('reason', '')[:60]})"
    )
    state = "passed" if difference < 1e-10 else "failed"
    return Outcome(
        "levers",
        state,
        f"images/s vs fp32: {ratios}; accumulation vs one batch (float64) {difference:.1e}; {sweep}",
        figures={"levers": result},
    )


def all_reduce(c: Check) -> Outcome:
    # All six collectives in one job (NCCL's own reduce-scatter, alltoall and send/recv included); all-reduce's
    # figure leads, as nccl-tests' all_reduce_perf does in every cluster check.
    from lab.bench.comm.collective import NAMES

    c.lab(
        "collectives",
        "bench",
        "collective",
        "all",
        "--nproc-per-node",
        str(c.gpus),
        "-b",
        "1M",
        "-e",
        "1G",
        "-f",
        "4",
        "--json",
        str(c.out / "collective.json"),
    )
    results = {name: json.loads((c.out / f"collective-{name}.json").read_text()) for name in NAMES}
    wrong = {name: sum(row["oop_wrong"] + (row["ip_wrong"] or 0) for row in r["rows"]) for name, r in results.items()}
    if any(wrong.values()):
        raise StepFailed(
            "wrong elements in collective results: " + ", ".join(f"{n} {w}" for n, w in wrong.items() if w)
        )
    r = results["all_reduce"]
    best = max(r["rows"], key=lambda row: row["size"])
    others = ", ".join(f"{name} {result['avg_busbw']:.0f}" for name, result in results.items() if name != "all_reduce")
    return Outcome(
        "all-reduce",
        "passed",
        f"{c.gpus} GPUs: busbw {best['ip_busbw']:.0f} GB/s at "
        f"{best['size'] / 2**20:.0f} MiB, average {r['avg_busbw']:.0f} GB/s; average busbw of the other "
        f"collectives: {others} GB/s",
        figures=results,
    )


def metrics_overhead(c: Check) -> Outcome:
    c.lab(
        "metrics-overhead",
        "bench",
        "metrics-overhead",
        "--config",
        c.config,
        *c.fast,
        "--rounds",
        "1" if c.quick else "3",
        "--steps",
        "4" if c.quick else "50",
        "--json",
        str(c.out / "overhead.json"),
    )
    overhead = json.loads((c.out / "overhead.json").read_text())["overhead"]
    return Outcome(
        "metrics",
        "passed",
        f"exporter on vs off: {overhead:+.2%} (target <= +1%: {_mark(overhead <= TARGET_METRICS_OVERHEAD)})",
        figures={"overhead": overhead},
    )


def lightning_peer(c: Check) -> Outcome:
    """The lab's images/s over PyTorch Lightning's for the same ResNet-18, global batch and steps, in one run.
    bf16 on a GPU; fp32 at toy size on a CPU, where bf16 convolutions are ten times slower than fp32."""
    sets = [*c.common, "train.amp=bf16" if c.gpu else "train.amp=off"]  # its data, run folder and ids are its own
    c.lab(
        "lightning",
        "bench",
        "lightning",
        "--config",
        c.config,
        *_sets(sets),
        "--steps",
        "4" if c.quick else "50",
        "--json",
        str(c.out / "lightning.json"),
    )
    r = json.loads((c.out / "lightning.json").read_text())
    return Outcome(
        "Lightning peer",
        "passed",
        f"the lab {r['lab_images_per_second']:,.0f} images/s, Lightning "
        f"{r['lightning_images_per_second']:,.0f}: {r['ratio_lab_over_lightning']:.2f}x "
        f"({'bf16' if c.gpu else 'fp32'}, same model, global batch and steps)",
        figures=r,
    )


def _mark(ok: bool) -> str:
    return "met" if ok else "missed"
