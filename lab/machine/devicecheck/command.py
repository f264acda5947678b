"""The one-command device check: every GPU path of the lab, run for real on one host, inside a deadline.

    make gpu-check                                      # = scripts/gpu-check.sh: no venv, no network needed
    scripts/gpu-check.sh --quick --allow-cpu OUT_DIR    # every step a CPU can run, at toy sizes (the tests)
    lab gpu-check --out runs/gpu-check --deadline 360

The steps are one table, STEPS, ordered by what a short window on a borrowed GPU must not miss: the
defects fixed last first (FSDP, bf16 training, NCCL DDP on one rank with accumulation, host syncs), then
throughput, correctness, memory, the other benchmarks, and torch.compile last (its cold compile is the
slowest thing here and measures only itself):

  doctor          `lab doctor`: driver, CUDA, NCCL, shared memory, ports, a compiler for torch.compile
  FSDP            `lab train` with dist.strategy=fsdp, train.amp=bf16: FSDP2 on a 1-rank NCCL group (gloo on a CPU)
  bf16 training   `lab train` with train.amp=bf16, no process group: the path a first run takes
  DDP, 1 rank     `lab train` with a 1-rank NCCL process group (dist.single_process_group):
                  init_process_group(device_id=...), DDP on CUDA, no_sync with accumulation
  host syncs      training steps under torch.cuda.set_sync_debug_mode("error"), bf16 and fp16 (none allowed),
                  then SyncBatchNorm, whose host sync is expected and shown (lab.machine.devicecheck.measure)
  host<->device   `lab bench hostdevice`: pinned copies to and from each GPU, the GPU-to-GPU matrix
  training        `lab train` for a few epochs of synthetic data: wall time, images/s
  data path       `lab bench pipeline`: the lab's device-resident data path against a
                  torchvision DataLoader path, data alone (target 10x) and with the training step
  deterministic   two runs with run.deterministic=true give bit-identical losses
  resume          a run stopped at half way and resumed matches the run that was not stopped
  memory          model state (parameters, gradients, momentum) measured with
                  torch.cuda.memory_allocated against the estimator, like with like; peak apart
  strategies      `lab bench strategies` on every GPU in bf16: DDP, FSDP, ZeRO-1/2/3 (with DeepSpeed),
                  Horovod (with `make horovod`; else "not installed")
  levers          `lab bench levers` on every GPU: bf16 and fp16 + GradScaler against fp32, accumulation, buckets,
                  the step's peak memory, and (2 GPUs or more) the NCCL_ALGO/PROTO/P2P sweep
  all-reduce      `lab bench collective all` over every GPU of the host (2 GPUs or more)
  predict         `lab predict` over every GPU of the host: 1 and 2 measured, 3..N predicted then measured, the
                  largest error (3 GPUs or more; on a CPU, 3 gloo ranks)
  exercise        `lab exercise check convert` on its reference solution: the grader's observer on NCCL, a rank a
                  GPU (3 GPUs or more; else gloo, said so)
  metrics         `lab bench metrics-overhead`: exporter on vs off (target <= 1%)
  hang record     `lab bench hang-record`: the collective record over NCCL, on vs off (target <= 1%)
  Lightning peer  `lab bench lightning`: the lab's images/s over PyTorch Lightning's, same model, batch, steps
  DDP + compile   the 1-rank DDP run with torch.compile (DDPOptimizer) and static_graph

Before the first step the plan is printed: each step with its expected seconds (on one H200; with --quick,
at toy sizes on a 2-core CPU) and their sum, and each step this host cannot run with the reason: no GPU,
one GPU, or a package that is missing (the preflight names it: the check and its training and NCCL steps
need only torch, torchvision, PyYAML and numpy). Every step is a child process with its output in
OUT/<step>.log. The deadline (--deadline, default 360 s) bounds the whole check: a child's limit is the
smaller of its step's own limit and what is left of the deadline, and a child over it is stopped with its
process group (torchrun's workers hold GPUs and NCCL); once the deadline is spent the steps left are
reported skipped. gpu-check.json is rewritten after every step, so a check cut short or killed leaves every
finished result; the table comes last.

Without a GPU, `--skip-without-gpu` (what `make gpu-check` passes) says so, lists the
steps it skipped and exits 0; `--quick --allow-cpu` runs every step a CPU can at toy sizes
(gloo instead of NCCL), so the command itself is tested where no GPU is.
Exit codes: 0 every step passed or was skipped for what the host lacks; 1 a step failed or the deadline cut
the check short; 2 bad input.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.machine.devicecheck.bench_steps import (  # the steps, named here by the table below (and the tests)
    all_reduce,
    data_path,
    hang_record,
    host_device,
    host_syncs,
    levers,
    lightning_peer,
    memory,
    metrics_overhead,
    strategies,
)
from lab.machine.devicecheck.harness import (
    HOW_TO_GET,
    MIN_START_SECONDS,
    STEP_LIMIT,
    STOP_SECONDS,
    Check,
    DeadlineCut,
    Outcome,
    StepFailed,
    Terminated,
)
from lab.machine.devicecheck.predict_step import PREDICT_RANKS, predict
from lab.machine.devicecheck.train_steps import (
    bf16_training,
    deterministic_and_resume,
    doctor,
    exercise,
    fsdp,
    one_rank_ddp,
    training,
)


@dataclass(frozen=True)
class Step:
    """One row of the check: the line(s) it reports, its expected seconds, what it needs, the function."""

    name: str
    seconds: int  # expected on one H200 (process starts included)
    quick_seconds: int  # expected with --quick: toy sizes on a 2-core CPU (on the GPU for GPU steps)
    run: Callable[[Check], Outcome | list[Outcome]]
    gpus: int = 0  # GPUs it needs (1: CUDA only; 2: more than one)
    no_gpu: str = ""  # why it cannot run on a CPU, when gpus > 0
    ranks: int = 0  # GPUs it needs on a GPU host, where a CPU runs it on as many processes (--allow-cpu)
    few_gpus: str = "the 1-rank DDP steps ran NCCL"  # what a host with fewer GPUs than it needs still ran, or why
    needs: tuple[str, ...] = ()  # modules without which it is skipped, saying so
    optional: tuple[tuple[str, str], ...] = ()  # (module, what is left out without it): it runs, smaller
    limit: int = STEP_LIMIT  # seconds each of its children may take at most
    lines: tuple[str, ...] = ()  # the table's lines, when more than its name

    @property
    def names(self) -> tuple[str, ...]:
        return self.lines or (self.name,)


STEPS: tuple[Step, ...] = (
    Step("doctor", 5, 3, doctor, limit=60),
    Step("FSDP", 15, 15, fsdp, limit=120),
    Step("bf16 training", 12, 12, bf16_training, limit=120),
    Step("DDP, 1 rank", 15, 15, lambda c: one_rank_ddp(c, compiled=False), limit=120),
    Step(
        "host syncs",
        25,
        20,
        host_syncs,
        gpus=1,
        limit=150,
        no_gpu="no CUDA device (the CPU tests count syncs and host copies instead)",
    ),
    Step(
        "host<->device",
        5,
        5,
        host_device,
        gpus=1,
        limit=60,
        no_gpu="no CUDA device: the CPU tests run the same copies host memory to host memory",
    ),
    Step("training", 20, 15, lambda c: training(c, c.epochs), limit=180),
    Step("data path", 25, 15, data_path, limit=180),
    Step("deterministic", 30, 35, deterministic_and_resume, limit=120, lines=("deterministic", "resume")),
    Step(
        "memory",
        8,
        5,
        memory,
        gpus=1,
        limit=90,
        no_gpu="no CUDA device: the CPU has no allocator counter to measure with",
    ),
    Step(
        "strategies",
        50,
        40,
        strategies,
        gpus=1,
        limit=240,
        optional=(("deepspeed", "the ZeRO-1/2/3 rows"),),
        no_gpu="no CUDA device: the CPU tests train every strategy on gloo",
    ),
    Step(
        "levers",
        30,
        25,
        levers,
        gpus=1,
        limit=180,
        no_gpu="no CUDA device: the CPU tests run the levers on gloo (no fp16, no NCCL)",
    ),
    Step("all-reduce", 40, 20, all_reduce, gpus=2, limit=240, no_gpu="no GPU: the CPU tests time all-reduce over gloo"),
    Step(
        "predict",
        90,  # a torchrun job per world size, 1..8 on eight GPUs, each about 10 s (the start, NCCL's set-up, 10 steps)
        40,  # 3 gloo ranks at toy size: 30-40 s on 2 cores
        predict,
        ranks=PREDICT_RANKS,
        limit=300,
        few_gpus="it measures 1 and 2, the fewest its model reads latency and bandwidth from, and predicts 3 and more",
    ),
    Step("exercise", 30, 30, exercise, limit=150),
    Step("metrics", 20, 12, metrics_overhead, needs=("prometheus_client",), limit=150),
    Step("hang record", 40, 30, hang_record, limit=180),
    Step(
        "Lightning peer",
        30,
        20,
        lightning_peer,
        needs=("lightning", "lab.measure.bench.train.lightning_peer"),
        limit=180,
    ),
    Step(
        "DDP + compile",
        90,  # a cold Inductor compile of ResNet-18 under DDP often takes more than a minute
        45,
        lambda c: one_rank_ddp(c, compiled=True),
        gpus=1,
        limit=240,
        no_gpu="torch.compile on a CPU takes minutes at any size; the GPU check runs it",
    ),
)

STEP_NAMES = tuple(line for step in STEPS for line in step.names)


# ----------------------------------------------------------------------------- the plan


def missing(module: str) -> bool:
    """True when `module` cannot be found (a finder that refuses it, as a bare interpreter's, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def skip_reason(step: Step, c: Check) -> str | None:
    """Why this host cannot run `step` (GPUs, packages), or None: the preflight."""
    if step.gpus and not c.gpu:
        return step.no_gpu
    needed = max(step.gpus, step.ranks if c.gpu else 0)
    if c.gpus < needed:
        return f"{c.gpus} GPU on this host: {step.name} needs {needed} or more ({step.few_gpus})"
    absent = [m for m in step.needs if missing(m)]
    if absent:
        return "needs " + "; ".join(f"{m} ({HOW_TO_GET.get(m, f'pip install {m}')})" for m in absent)
    return None


# The plan keeps to this share of the deadline: a step's seconds on another host, a cold compile or a slow disk
# must find slack, not cut the check short on a healthy machine (exit 1).
PLAN_SHARE = 0.75


def plan(
    c: Check, steps: tuple[Step, ...], only: list[str] | None = None, deadline: float | None = None
) -> list[dict[str, Any]]:
    """Each step with its expected seconds and, where it cannot run here (or --only leaves it out), why; what it
    runs without. With a `deadline`, the steps are kept in the table's order while their sum stays within
    PLAN_SHARE of it; one that does not fit is left out, saying how long a deadline would take it in."""
    rows = []
    budget, planned = (PLAN_SHARE * deadline if deadline else float("inf")), 0.0
    reasons = {
        step.name: "not asked for (--only)" if only and step.name not in only else skip_reason(step, c)
        for step in steps
    }
    runnable = sum((s.quick_seconds if c.quick else s.seconds) for s in steps if not reasons[s.name])
    for step in steps:
        skip = reasons[step.name]
        seconds = step.quick_seconds if c.quick else step.seconds
        if not skip and planned + seconds > budget:
            skip = (
                f"left out to keep the plan within {PLAN_SHARE:.0%} of the {deadline:.0f} s deadline; "
                f"--deadline {math.ceil(runnable / PLAN_SHARE)} runs every step"  # rounded up: that one fits
            )
        planned += 0 if skip else seconds
        without = (
            [
                f"{m}: {what} left out ({HOW_TO_GET.get(m, f'pip install {m}')})"
                for m, what in step.optional
                if missing(m)
            ]
            if not skip
            else []
        )
        rows.append(
            {
                "step": step.name,
                "expected_seconds": 0 if skip else seconds,
                "skip": skip,
                "without": without,
            }
        )
    return rows


def render_plan(rows: list[dict[str, Any]], deadline: float, quick: bool) -> str:
    total = sum(r["expected_seconds"] for r in rows)
    where = "at toy sizes on a 2-core CPU" if quick else "on one H200"
    width = max(len(r["step"]) for r in rows)
    lines = [
        f"gpu-check plan: {sum(not r['skip'] for r in rows)} step(s), about {total} s expected ({where}) "
        f"of the {deadline:.0f} s deadline"
    ]
    for r in rows:
        what = f"skipped: {r['skip']}" if r["skip"] else f"{r['expected_seconds']:>4} s"
        lines.append(f"  {r['step'].ljust(width)}  {what}" + "".join(f"; without {w}" for w in r["without"]))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command


def check_only(only: list[str] | None) -> None:
    """--only names steps of the table, or it is refused in one line."""
    unknown = [name for name in only or () if name not in {step.name for step in STEPS}]
    if unknown:
        raise LabError(f"--only {unknown[0]!r}: no such step; the steps: {', '.join(s.name for s in STEPS)}")


def run(args) -> int:
    started = time.monotonic()
    check_only(getattr(args, "only", None))  # before torch is imported: bad input is refused at once
    import torch

    from lab.run.cluster import provenance

    gpu = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "runs", ignore_errors=True)  # a rerun must not resume the last check's runs
    result: dict[str, Any] = {
        "benchmark": "gpu-check",
        "gpu": gpu,
        "versions": provenance.versions(),
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "gpus": torch.cuda.device_count() if gpu else 0,
        "quick": args.quick,
        "deadline_seconds": args.deadline,
        "pythonpath": os.environ.get("PYTHONPATH", ""),
    }
    unusable = None if gpu else _gpu_torch_cannot_use()
    if unusable:
        result["steps"] = [asdict(Outcome("torch sees the GPU", "failed", unusable))]
        _write(args, out, result)
        print("\n" + render(result), flush=True)
        return 1
    if not gpu and not args.allow_cpu:
        if not args.skip_without_gpu:
            raise LabError(
                "gpu-check: no CUDA device is visible; run it on a GPU host (or --skip-without-gpu to "
                "report and skip, --quick --allow-cpu to test the command)"
            )
        result["steps"] = [asdict(Outcome(name, "skipped", "no GPU found")) for name in STEP_NAMES]
        _write(args, out, result)
        print(
            f"gpu-check: no GPU found (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
            f"skipped every step: {'; '.join(STEP_NAMES)}. Run it on a host with an NVIDIA GPU."
        )
        print("\n" + render(result), flush=True)
        return 0
    check = Check(
        out=out, quick=args.quick, gpu=gpu, gpus=result["gpus"], deadline_at=started + args.deadline, epochs=args.epochs
    )
    try:
        outcomes = run_steps(check, STEPS, result, args)
    except Terminated:
        print(f"gpu-check: stopped by SIGTERM; {out / 'gpu-check.json'} holds the steps that finished", file=sys.stderr)
        return 1
    print("\n" + render(result), flush=True)
    return 1 if any(o.status == "failed" or o.by_deadline for o in outcomes) else 0


def run_steps(check: Check, steps: tuple[Step, ...], result: dict[str, Any], args) -> list[Outcome]:
    """The plan printed, then each step in order; gpu-check.json rewritten after every one."""
    rows = plan(check, steps, getattr(args, "only", None), args.deadline)
    result.update(plan=rows, expected_seconds=sum(r["expected_seconds"] for r in rows), finished=False, steps=[])
    print(render_plan(rows, args.deadline, check.quick), flush=True)
    _write(args, check.out, result)
    outcomes: list[Outcome] = []
    previous = signal.getsignal(signal.SIGTERM)
    _on_sigterm(_terminate)
    try:
        for step, row in zip(steps, rows):
            outcomes += _one(step, row, check, args.deadline)
            result["steps"] = [asdict(o) for o in outcomes]
            _write(args, check.out, result)
        result["finished"] = True
    finally:
        _on_sigterm(previous)
        _write(args, check.out, result)  # on Ctrl-C or SIGTERM too: every finished step is kept
    return outcomes


def _one(step: Step, row: dict[str, Any], c: Check, deadline: float) -> list[Outcome]:
    if row["skip"]:
        return [Outcome(name, "skipped", row["skip"]) for name in step.names]
    if c.seconds_left() - STOP_SECONDS < MIN_START_SECONDS:
        why = f"deadline: the check's {deadline:.0f} s were spent before this step (--deadline)"
        return [Outcome(name, "skipped", why, by_deadline=True) for name in step.names]
    print(f"gpu-check: {step.name} ...", flush=True)
    c.step_limit = step.limit
    begun = time.perf_counter()
    cut = False
    try:
        done = step.run(c)
    except DeadlineCut as exc:
        done, cut = Outcome(step.name, "failed", str(exc)), True
    except StepFailed as exc:
        done = Outcome(step.name, "failed", str(exc))
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        done = Outcome(step.name, "failed", f"{type(exc).__name__}: {first}")
    done = done if isinstance(done, list) else [done]
    if cut and len(done) < len(step.names):  # the lines it could not reach are the deadline's too
        done += [Outcome(name, "skipped", "deadline: not reached", by_deadline=True) for name in step.names[1:]]
    for outcome in done:
        outcome.seconds = time.perf_counter() - begun
        outcome.by_deadline = outcome.by_deadline or cut
    return done


def _terminate(signum, frame) -> None:
    raise Terminated(f"signal {signum}")


def _on_sigterm(handler) -> None:
    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, TypeError):  # not the main thread (an embedding caller): it keeps its own handling
        pass


def _gpu_torch_cannot_use() -> str | None:
    """Why this torch sees no GPU although the host has one (NVML or the driver's device files say so), or None."""
    import torch

    from lab.run.cluster import nvml

    if not nvml.host_has_gpus():
        return None
    count = nvml.device_count()
    return (
        f"the host has {count or 'some'} NVIDIA GPU(s) (driver {nvml.driver_version() or 'unknown'}), but torch "
        f"{torch.__version__} ({sys.executable}; CUDA build: {torch.version.cuda or 'none, a CPU build'}) cannot "
        f"use them: use a CUDA build of torch that this driver supports (PYTHON=... make gpu-check), or start the "
        f"container with --gpus all"
    )


def _write(args, out: Path, result: dict[str, Any]) -> None:
    from lab.run.training import runs

    runs.write_json(out / "gpu-check.json", result)
    if args.json:
        runs.write_json(args.json, result)


def render(r: dict[str, Any]) -> str:
    v = r["versions"]
    head = (
        f"# lab gpu-check: {r['device']} x {r['gpus']}; driver {v.get('driver')}, CUDA {v.get('cuda')}, "
        f"NCCL {v.get('nccl')}, torch {v.get('torch')}"
        if r["gpu"]
        else f"# lab gpu-check: no GPU (CPU, torch {v.get('torch')})" + (", toy sizes" if r["quick"] else "")
    )
    width = max(len(s["step"]) for s in r["steps"])
    lines = [head, *(f"{s['step'].ljust(width)}  {s['status']:<7}  {s['detail']}" for s in r["steps"])]
    failed = sum(s["status"] == "failed" for s in r["steps"])
    ran = sum(s["status"] != "skipped" for s in r["steps"])
    late = sum(s["status"] == "skipped" and s.get("by_deadline", False) for s in r["steps"])
    lines.append(
        (
            f"{failed} of {ran} step(s) failed"
            if failed
            else f"{ran} step(s) passed, {len(r['steps']) - ran} skipped"
            if ran
            else "nothing checked: no GPU found"
        )
        + (f"; {late} not run: the {r['deadline_seconds']} s deadline was spent" if late else "")
    )
    return "\n".join(lines)
