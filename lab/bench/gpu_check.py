"""The one-command device check: every GPU path of the lab, run for real on one host.

    make gpu-check                                   # = scripts/gpu-check.sh: no venv, no network needed
    lab bench gpu-check --out runs/gpu-check         # the same from a venv; JSON and step logs in --out

Each step runs a real command of the lab (its output goes to a log in --out) or, for host
syncs and memory, measures in this process (lab/bench/gpu_measure.py), and ends passed,
failed or skipped; a table of them comes last, and `gpu-check.json` holds every figure.
About 5 minutes on one H100/H200:

  doctor         `lab doctor`: driver, CUDA, NCCL, shared memory, ports
  data path      `lab bench pipeline`: the lab's device-resident data path against a
                 torchvision DataLoader path, data alone (target 10x) and with the training step
  training       `lab train` for a few epochs of synthetic data: wall time, images/s
  host syncs     training steps under torch.cuda.set_sync_debug_mode("error"), bf16 and fp16
  DDP, 1 rank    `lab train` with a 1-rank NCCL process group (dist.single_process_group):
                 init_process_group(device_id=...), DDP on CUDA, no_sync with accumulation
  DDP + compile  the same with torch.compile (DDPOptimizer) and static_graph
  all-reduce     `lab bench collective all` over every GPU of the host: all-reduce's busbw, then the other
                 five collectives' (skipped with one GPU)
  memory         model state (parameters, gradients, momentum) measured with
                 torch.cuda.memory_allocated against the estimator, like with like; peak apart
  deterministic  two runs with run.deterministic=true give bit-identical losses
  resume         a run stopped at half way and resumed matches the run that was not stopped
  strategies     `lab bench strategies` on every GPU in bf16: DDP, FSDP, ZeRO-1/2/3 each train over NCCL
  levers         `lab bench levers` on every GPU: bf16 and fp16 + GradScaler against fp32, accumulation, buckets,
                 the step's peak memory, and (2 GPUs or more) the NCCL_ALGO/PROTO/P2P sweep
  metrics        `lab bench metrics-overhead`: exporter on vs off (target <= 1%)

Without a GPU, `--skip-without-gpu` (what `make gpu-check` passes) says so, lists the
steps it skipped and exits 0; `--quick --allow-cpu` runs every step at toy sizes on the
CPU (gloo instead of NCCL), so the command itself is tested where no GPU is.
Exit codes: 0 every step passed or was skipped; 1 a step failed; 2 bad input.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.errors import LabError

TARGET_IMAGES_PER_SECOND = 60_000   # training images/s of full-width ResNet-18 at batch 512 on one H100/H200
TARGET_DATA_RATIO = 10.0            # the lab's data path over a DataLoader path (data alone)
TARGET_METRICS_OVERHEAD = 0.01
STEP_TIMEOUT = 300                  # seconds: a hung step fails, the check goes on


@dataclass
class Outcome:
    step: str
    status: str                     # passed | failed | skipped
    detail: str
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


class StepFailed(Exception):
    """A step's command failed or its result is wrong; the message says which and where its log is."""


@dataclass
class Check:
    """What the steps share: where to write, how big to run, the overrides every `lab train` gets."""

    out: Path
    quick: bool
    gpu: bool
    gpus: int

    @property
    def config(self) -> str:
        return "smoke" if self.quick else "workshop-gpu"

    @property
    def fast(self) -> list[str]:
        """--set arguments of the benchmarks that time the training step: the settings a GPU run uses."""
        sets = ["model.width=8"] if self.quick else ["model.compile=true", "train.amp=bf16", "model.channels_last=true"]
        return [x for o in sets for x in ("--set", o)]

    @property
    def common(self) -> list[str]:
        if self.quick:
            return ["model.width=8", "data.source=synthetic", "data.synthetic_train_size=256",
                    "data.synthetic_test_size=64", "train.global_batch_size=32"]
        # batch 512: lr by the linear rule from workshop-gpu's 1.6 at 2048, warm-up of the same share
        return ["data.source=synthetic", "data.synthetic_train_size=16384", "data.synthetic_test_size=2048",
                "train.global_batch_size=512", "train.lr=0.4", "train.warmup_steps=12", "train.amp=bf16",
                "model.channels_last=true"]

    def lab(self, log: str, *argv: str) -> None:
        """`python -m lab ARGV` with its output in OUT/LOG.log; StepFailed when it exits non-zero."""
        command = [sys.executable, "-m", "lab", *argv]
        path = self.out / f"{log}.log"
        with open(path, "w") as f:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            # Its own session: on a timeout the whole tree goes (torchrun's workers hold GPUs and NCCL).
            child = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = child.wait(timeout=STEP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill_tree(child)
                raise StepFailed(f"no result within {STEP_TIMEOUT} s; see {path}") from None
        if code != 0:
            tail = path.read_text().strip().splitlines()[-1:] or [""]
            raise StepFailed(f"exit {code}: {tail[0][:160]}; see {path}")

    def train(self, log: str, run_id: str, *overrides: str) -> list[dict]:
        """`lab train` of the check's config with `overrides`; the run's train rows (last row per step)."""
        sets = [x for o in [*self.common, f"run.output_dir={self.out / 'runs'}", f"run.id={run_id}",
                            "metrics.port_base=0", *overrides] for x in ("--set", o)]
        self.lab(log, "train", "--config", self.config, *sets)
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
        return [rows[s] for s in sorted(rows)]


# ----------------------------------------------------------------------------- the steps


def doctor(c: Check) -> Outcome:
    c.lab("doctor", "doctor", "--json", str(c.out / "doctor.json"), "--output-dir", str(c.out))
    checks = json.loads((c.out / "doctor.json").read_text())["checks"]
    warned = [k["name"] for k in checks if k["status"] != "ok"]
    return Outcome("doctor", "passed", f"{len(checks)} checks" + (f"; not ok: {', '.join(warned)}" if warned else ""))


def data_path(c: Check) -> Outcome:
    c.lab("pipeline", "bench", "pipeline", "--config", c.config, *c.fast,
          "--batch-size", "64" if c.quick else "512", "--batches", "2" if c.quick else "50",
          "--rounds", "1" if c.quick else "3", "--num-workers", "0" if c.quick else "8",
          "--json", str(c.out / "pipeline.json"))
    p = json.loads((c.out / "pipeline.json").read_text())
    data, step = p["data_ratio_lab_over_torchvision"], p["train_ratio_lab_over_torchvision"]
    images = p["median_images_per_second"]["lab_train"]
    detail = (f"data alone {data:.1f}x the DataLoader path "
              f"(target {TARGET_DATA_RATIO:.0f}x: {_mark(data >= TARGET_DATA_RATIO)}); "
              f"with the training step {step:.2f}x; {images:,.0f} training images/s")
    if c.gpu and not c.quick:
        detail += f" (target {TARGET_IMAGES_PER_SECOND:,}: {_mark(images >= TARGET_IMAGES_PER_SECOND)})"
    return Outcome("data path", "passed", detail, figures=p)


def training(c: Check, epochs: int) -> Outcome:
    started = time.perf_counter()
    c.train("training", "training", f"train.epochs={1 if c.quick else epochs}", "checkpoint.save=false")
    summary = json.loads((c.out / "runs" / "training" / "summary.json").read_text())
    wall = time.perf_counter() - started
    return Outcome("training", "passed", f"{summary['steps']} steps in {wall:.1f} s (process start included), "
                   f"{summary['samples_per_second'] or 0:,.0f} images/s", figures=summary)


def host_syncs(c: Check) -> Outcome:
    """Training steps with CUDA's sync debug mode set to error: any host sync between log intervals raises.
    Under bf16, and under fp16, whose GradScaler would read found-inf back every step if the optimizer
    could not take it on the device (the fused SGD does)."""
    from lab import config
    from lab.bench import gpu_measure

    if not c.gpu:
        return Outcome("host syncs", "skipped", "no CUDA device (the CPU tests count syncs and host copies instead)")
    steps = 12
    for amp in ("bf16", "fp16"):
        # 32 batches of 256: no epoch boundary inside the guarded steps
        cfg = config.load(c.config, [*c.common, "data.synthetic_train_size=8192", "train.global_batch_size=256",
                                     f"train.amp={amp}"])
        sync = gpu_measure.first_host_sync(cfg, steps)
        if sync:
            raise StepFailed(f"{amp}: a host sync inside the step loop: {sync}")
    return Outcome("host syncs", "passed", f"none in {steps} steps under set_sync_debug_mode('error'), bf16 and fp16")


def one_rank_ddp(c: Check, compiled: bool) -> Outcome:
    name = "DDP + compile" if compiled else "DDP, 1 rank"
    if compiled and not c.gpu:
        return Outcome(name, "skipped", "torch.compile on a CPU takes minutes at any size; the GPU check runs it")
    run_id = "ddp-1rank-compiled" if compiled else "ddp-1rank"
    extra = ["model.compile=true", "dist.static_graph=true"] if compiled else ["train.grad_accum_steps=2"]
    rows = c.train(run_id, run_id, "dist.single_process_group=true", "train.max_steps=12", "train.log_every=4",
                   "checkpoint.save=false", *extra)
    backend = json.loads((c.out / "runs" / run_id / "manifest.json").read_text())["backend"]
    if backend != ("nccl" if c.gpu else "gloo"):
        raise StepFailed(f"the process group used {backend}, not {'nccl' if c.gpu else 'gloo'}")
    losses = [r["loss"] for r in rows]
    what = "torch.compile (DDPOptimizer), static_graph" if compiled else "gradient accumulation 2 (no_sync)"
    return Outcome(name, "passed", f"{backend} process group of 1, DDP, {what}: {rows[-1]['step']} steps, loss "
                   f"{losses[0]:.3f} -> {losses[-1]:.3f}")


def all_reduce(c: Check) -> Outcome:
    if not c.gpu:
        return Outcome("all-reduce", "skipped", "no GPU: the CPU tests time all-reduce over gloo")
    if c.gpus < 2:
        return Outcome("all-reduce", "skipped", "1 GPU on this host: an all-reduce needs 2 or more "
                                                "(the 1-rank DDP steps ran NCCL)")
    # All six collectives in one job (NCCL's own reduce-scatter, alltoall and send/recv included); all-reduce's
    # figure leads, as nccl-tests' all_reduce_perf does in every cluster check.
    from lab.bench.collective import NAMES

    c.lab("collectives", "bench", "collective", "all", "--nproc-per-node", str(c.gpus), "-b", "1M", "-e", "1G",
          "-f", "4", "--json", str(c.out / "collective.json"))
    results = {name: json.loads((c.out / f"collective-{name}.json").read_text()) for name in NAMES}
    wrong = {name: sum(row["oop_wrong"] + (row["ip_wrong"] or 0) for row in r["rows"]) for name, r in results.items()}
    if any(wrong.values()):
        raise StepFailed("wrong elements in collective results: " + ", ".join(f"{n} {w}" for n, w in wrong.items() if w))
    r = results["all_reduce"]
    best = max(r["rows"], key=lambda row: row["size"])
    others = ", ".join(f"{name} {result['avg_busbw']:.0f}" for name, result in results.items() if name != "all_reduce")
    return Outcome("all-reduce", "passed", f"{c.gpus} GPUs: busbw {best['ip_busbw']:.0f} GB/s at "
                   f"{best['size'] / 2**20:.0f} MiB, average {r['avg_busbw']:.0f} GB/s; average busbw of the other "
                   f"collectives: {others} GB/s", figures=results)


def memory(c: Check) -> Outcome:
    """Model state measured like the estimate counts it: parameters, gradients and momentum, no activations."""
    from lab.bench import gpu_measure
    from lab.memory import MEASURED_RECIPE, estimate

    if not c.gpu:
        return Outcome("memory", "skipped", "no CUDA device: the CPU has no allocator counter to measure with")
    state, peak, params = gpu_measure.model_state_bytes(8 if c.quick else 64)
    expected = estimate(params, 1, *MEASURED_RECIPE)[0]["total_bytes"]
    ratio = state / expected
    if not 0.95 <= ratio <= 1.10:  # allocator rounding and BatchNorm buffers only
        raise StepFailed(f"model state {state / 1e6:.1f} MB measured vs {expected / 1e6:.1f} MB estimated "
                         f"(ratio {ratio:.2f}): the estimator is off")
    return Outcome("memory", "passed", f"model state {state / 1e6:.1f} MB measured / {expected / 1e6:.1f} MB "
                   f"estimated = {ratio:.2f}; peak with activations and workspaces at batch 256: "
                   f"{peak / 1e6:.0f} MB", figures={"state_bytes": state, "estimate_bytes": expected,
                                                     "ratio": ratio, "peak_bytes": peak})


def deterministic_and_resume(c: Check) -> list[Outcome]:
    """A: 8 steps. B: the same, stopped after 4 and resumed. B's first half must equal A's (determinism across
    processes), and its resumed half must equal A's too (resume)."""
    run = ["run.deterministic=true", "train.max_steps=8", "train.log_every=1", "model.compile=false"]
    a = [r["loss"] for r in c.train("deterministic", "deterministic-a", *run, "checkpoint.save=false",
                                    "checkpoint.resume=never")]
    c.train("resume-stop", "deterministic-b", *run, "train.stop_after_steps=4", "checkpoint.resume=never")
    b = [r["loss"] for r in c.train("resume", "deterministic-b", *run)]
    resumed = json.loads((c.out / "runs" / "deterministic-b" / "summary.json").read_text())
    if resumed["steps"] != 8:
        raise StepFailed(f"the resumed run ended at step {resumed['steps']}, not 8")
    outcomes = []
    first = "passed" if a[:4] == b[:4] else "failed"
    outcomes.append(Outcome("deterministic", first, "two runs, bit-identical losses over 4 steps" if first == "passed"
                            else f"losses differ: {a[:4]} vs {b[:4]}"))
    second = "passed" if len(b) == 8 and a[4:] == b[4:] else "failed"
    outcomes.append(Outcome("resume", second, "stopped at step 4, resumed: steps 5-8 bit-identical to the run that "
                            "was not stopped" if second == "passed" else f"losses differ: {a[4:]} vs {b[4:]}"))
    return outcomes


def strategies(c: Check) -> Outcome:
    """DDP, FSDP and DeepSpeed ZeRO-1/2/3 each train on this host's GPUs over NCCL with bf16 (FSDP's mixed-precision
    policy, DeepSpeed's own bf16): what the CPU tests cannot run."""
    if not c.gpu:
        return Outcome("strategies", "skipped", "no CUDA device: the CPU tests train every strategy on gloo")
    c.lab("strategies", "bench", "strategies", "--nproc-per-node", str(c.gpus), "--steps", "6",
          "--set", "train.amp=bf16", "--json", str(c.out / "strategies.json"))
    rows = json.loads((c.out / "strategies.json").read_text())["rows"]
    ran = [r for r in rows if "error" not in r]
    absent = [r["label"] for r in rows if "not installed" in r.get("error", "")]
    state = ", ".join(f"{r['label']} {r['state_bytes'] / 2**20:.1f}" for r in ran)
    return Outcome("strategies", "passed", f"{c.gpus} GPU(s), bf16: state per rank (MiB) {state}; largest loss gap "
                   f"from DDP {max(r['loss_gap_from_ddp'] for r in ran):.1e}"
                   + (f"; not installed: {', '.join(absent)}" if absent else ""), figures={"rows": rows})


def levers(c: Check) -> Outcome:
    """The levers where they matter: fp16 with its GradScaler, CUDA peak memory, and NCCL's variables."""
    if not c.gpu:
        return Outcome("levers", "skipped", "no CUDA device: the CPU tests run the levers on gloo (no fp16, no NCCL)")
    c.lab("levers", "bench", "levers", "--nproc-per-node", str(c.gpus), "--steps", "5", "--rounds", "2",
          "--json", str(c.out / "levers.json"))
    result = json.loads((c.out / "levers.json").read_text())
    groups = result["groups"]
    ratios = ", ".join(f"{r['label']} {r['ratio_to_plain']:.2f}x" for r in groups["precision"] if "ratio_to_plain" in r)
    difference = groups["accumulation"]["equivalence"]["max_parameter_difference"]
    nccl = groups["nccl"]
    sweep = (", ".join(f"{r['label']} {r['ratio_to_default']:.2f}x" for r in nccl["rows"] if r.get("ratio_to_default"))
             if nccl.get("applicable") else f"NCCL sweep not applicable ({nccl.get('reason', '')[:60]})")
    state = "passed" if difference < 1e-10 else "failed"
    return Outcome("levers", state, f"images/s vs fp32: {ratios}; accumulation vs one batch (float64) "
                   f"{difference:.1e}; {sweep}", figures={"levers": result})


def metrics_overhead(c: Check) -> Outcome:
    c.lab("metrics-overhead", "bench", "metrics-overhead", "--config", c.config, *c.fast,
          "--rounds", "1" if c.quick else "3",
          "--steps", "4" if c.quick else "100", "--json", str(c.out / "overhead.json"))
    overhead = json.loads((c.out / "overhead.json").read_text())["overhead"]
    return Outcome("metrics", "passed", f"exporter on vs off: {overhead:+.2%} (target <= +1%: "
                   f"{_mark(overhead <= TARGET_METRICS_OVERHEAD)})", figures={"overhead": overhead})


STEP_NAMES = ("doctor", "data path", "training", "host syncs", "DDP, 1 rank", "DDP + compile", "all-reduce", "memory",
              "deterministic", "resume", "strategies", "levers", "metrics")


# ----------------------------------------------------------------------------- the command


def run(args) -> int:
    import torch

    from lab import provenance

    gpu = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "runs", ignore_errors=True)  # a rerun must not resume the last check's runs
    result: dict[str, Any] = {"benchmark": "gpu-check", "gpu": gpu, "versions": provenance.versions(),
                              "device": torch.cuda.get_device_name(0) if gpu else "cpu",
                              "gpus": torch.cuda.device_count() if gpu else 0, "quick": args.quick}
    unusable = None if gpu else _gpu_torch_cannot_use()
    if unusable:
        result["steps"] = [asdict(Outcome("torch sees the GPU", "failed", unusable))]
        _write(args, out, result)
        print("\n" + render(result), flush=True)
        return 1
    if not gpu and not args.allow_cpu:
        if not args.skip_without_gpu:
            raise LabError("gpu-check: no CUDA device is visible; run it on a GPU host (or --skip-without-gpu to "
                           "report and skip, --quick --allow-cpu to test the command)")
        result["steps"] = [asdict(Outcome(name, "skipped", "no GPU found")) for name in STEP_NAMES]
        _write(args, out, result)
        print(f"gpu-check: no GPU found (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
              f"skipped every step: {'; '.join(STEP_NAMES)}. Run it on a host with an NVIDIA GPU.")
        print("\n" + render(result), flush=True)
        return 0
    check = Check(out=out, quick=args.quick, gpu=gpu, gpus=result["gpus"])
    steps: list[tuple[str, Callable[[], Outcome | list[Outcome]]]] = [
        ("doctor", lambda: doctor(check)),
        ("data path", lambda: data_path(check)),
        ("training", lambda: training(check, args.epochs)),
        ("host syncs", lambda: host_syncs(check)),
        ("DDP, 1 rank", lambda: one_rank_ddp(check, compiled=False)),
        ("DDP + compile", lambda: one_rank_ddp(check, compiled=True)),
        ("all-reduce", lambda: all_reduce(check)),
        ("memory", lambda: memory(check)),
        ("deterministic", lambda: deterministic_and_resume(check)),
        ("strategies", lambda: strategies(check)),
        ("levers", lambda: levers(check)),
        ("metrics", lambda: metrics_overhead(check)),
    ]
    outcomes: list[Outcome] = []
    for name, step in steps:
        print(f"gpu-check: {name} ...", flush=True)
        started = time.perf_counter()
        try:
            done = step()
        except StepFailed as exc:
            done = Outcome(name, "failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - one broken step must not hide the others' results
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            done = Outcome(name, "failed", f"{type(exc).__name__}: {first}")
        for outcome in done if isinstance(done, list) else [done]:
            outcome.seconds = time.perf_counter() - started
            outcomes.append(outcome)
    result["steps"] = [asdict(o) for o in outcomes]
    _write(args, out, result)
    print("\n" + render(result), flush=True)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def _gpu_torch_cannot_use() -> str | None:
    """Why this torch sees no GPU although the host has one (NVML or the driver's device files say so), or None."""
    import torch

    from lab import nvml

    if not nvml.host_has_gpus():
        return None
    count = nvml.device_count()
    return (f"the host has {count or 'some'} NVIDIA GPU(s) (driver {nvml.driver_version() or 'unknown'}), but torch "
            f"{torch.__version__} ({sys.executable}; CUDA build: {torch.version.cuda or 'none, a CPU build'}) cannot "
            f"use them: use a CUDA build of torch that this driver supports (PYTHON=... make gpu-check), or start the "
            f"container with --gpus all")


def _kill_tree(child: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
            child.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _write(args, out: Path, result: dict[str, Any]) -> None:
    from lab import runs

    runs.write_json(out / "gpu-check.json", result)
    if args.json:
        runs.write_json(args.json, result)


def render(r: dict[str, Any]) -> str:
    v = r["versions"]
    head = (f"# lab gpu-check: {r['device']} x {r['gpus']}; driver {v.get('driver')}, CUDA {v.get('cuda')}, "
            f"NCCL {v.get('nccl')}, torch {v.get('torch')}" if r["gpu"] else
            f"# lab gpu-check: no GPU (CPU, torch {v.get('torch')})" + (", toy sizes" if r["quick"] else ""))
    width = max(len(s["step"]) for s in r["steps"])
    lines = [head, *(f"{s['step'].ljust(width)}  {s['status']:<7}  {s['detail']}" for s in r["steps"])]
    failed = sum(s["status"] == "failed" for s in r["steps"])
    ran = sum(s["status"] != "skipped" for s in r["steps"])
    lines.append(f"{failed} of {ran} step(s) failed" if failed else
                 f"{ran} step(s) passed, {len(r['steps']) - ran} skipped" if ran else "nothing checked: no GPU found")
    return "\n".join(lines)


def _mark(ok: bool) -> str:
    return "met" if ok else "missed"
