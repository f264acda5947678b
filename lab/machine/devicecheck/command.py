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
                  GPU (3 GPUs or more; else gloo, said so); with 2 GPUs or more, own-ddp's solution too (its
                  overlap read from the handles' waits, the compute stream's order on NCCL) and fix-batchnorm's
                  (SyncBatchNorm's statistics against the global batch's)
  metrics         `lab bench metrics-overhead`: exporter on vs off (target <= 1%)
  hang record     `lab bench hang-record`: the collective record over NCCL, on vs off (target <= 1%)
  Lightning peer  `lab bench lightning`: the lab's images/s over PyTorch Lightning's, same model, batch, steps
  DDP + compile   the 1-rank DDP run with torch.compile (DDPOptimizer) and static_graph

Before the first step the plan is printed (lab.machine.devicecheck.plan): each step with its expected seconds (on
one H200, some growing with the GPUs; with --quick, at toy sizes on a 2-core CPU) and their sum, each step this
host's hardware cannot run as not applicable (no GPU, one GPU), and each step left out otherwise as not run (not
asked for, a missing package: the check and its training and NCCL steps need only torch, torchvision, PyYAML and
numpy). Every step is a child process with its output in OUT/<step>.log. The deadline bounds the whole check; by
default it is made to fit every step the hardware allows with a quarter to spare, and --deadline SECONDS sets it by
hand. A child's limit is the smaller of its step's own limit and what is left of the deadline, and a child over it
is stopped with its process group (torchrun's workers hold GPUs and NCCL); once the deadline is spent the steps
left are not run. gpu-check.json is rewritten after every step, so a check cut short or killed leaves every
finished result; the table comes last.

Verdicts are lab.verdict's: held, failed, not run, not applicable. A check with a step not run is incomplete: it
did not test what it names, so it does not pass, and `lab accept` fails the node naming the step.
Without a GPU, `--skip-without-gpu` (what `make gpu-check` passes) says so, reports every step not applicable and
exits 0 (`lab accept` does not take that for a GPU node's check); `--quick --allow-cpu` runs every step a CPU can
at toy sizes (gloo instead of NCCL), so the command itself is tested where no GPU is.
Exit codes: 0 every step held or was not applicable; 1 a step failed; 4 incomplete: none failed, but a step was
not run (the line says which); 2 bad input.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from lab.errors import EXIT_FAILED, EXIT_OK, LabError
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
    MIN_START_SECONDS,
    STOP_SECONDS,
    DeadlineCut,
    Harness,
    Outcome,
    StepFailed,
    Terminated,
)
from lab.machine.devicecheck.plan import Step, deadline_for, plan, render_plan
from lab.machine.devicecheck.predict_step import PREDICT_RANKS, predict
from lab.machine.devicecheck.report import exit_code, render
from lab.machine.devicecheck.train_steps import (
    bf16_training,
    deterministic_and_resume,
    doctor,
    exercise,
    fsdp,
    one_rank_ddp,
    training,
)
from lab.verdict import FAILED, NOT_APPLICABLE, NOT_RUN, overall

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
    Step(
        "all-reduce",
        16,  # 40 s on eight GPUs: the six collectives over every GPU, NCCL's set-up growing with them
        20,
        all_reduce,
        gpus=2,
        limit=240,
        no_gpu="no GPU: the CPU tests time all-reduce over gloo",
        per_gpu=3,
    ),
    Step(
        "predict",
        10,  # and 10 s a GPU: a torchrun job per world size, 1..N, each about 10 s (the start, NCCL, 10 steps)
        40,  # 3 gloo ranks at toy size: 30-40 s on 2 cores
        predict,
        ranks=PREDICT_RANKS,
        per_gpu=10,
        limit=300,
        few_gpus="it measures 1 and 2, the fewest its model reads latency and bandwidth from, and predicts 3 and more",
    ),
    Step("exercise", 30, 30, exercise, limit=150, per_gpu=5),  # own-ddp on 2 GPUs and more: about 40 s on 8
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


# ----------------------------------------------------------------------------- the command


def check_only(only: list[str] | None) -> None:
    """--only names steps of the table, or it is refused in one line."""
    unknown = [name for name in only or () if name not in {step.name for step in STEPS}]
    if unknown:
        raise LabError(f"--only {unknown[0]!r}: no such step; the steps: {', '.join(s.name for s in STEPS)}")


def run(args: argparse.Namespace) -> int:
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
        result["steps"] = [asdict(Outcome("torch sees the GPU", FAILED, unusable))]
        result["verdict"] = FAILED
        _write(args, out, result)
        print("\n" + render(result), flush=True)
        return EXIT_FAILED
    if not gpu and not args.allow_cpu:
        if not args.skip_without_gpu:
            raise LabError(
                "gpu-check: no CUDA device is visible; run it on a GPU host (or --skip-without-gpu to "
                "report it and exit 0, --quick --allow-cpu to test the command)"
            )
        result["steps"] = [asdict(Outcome(name, NOT_APPLICABLE, "no GPU found")) for name in STEP_NAMES]
        result["verdict"] = NOT_APPLICABLE
        _write(args, out, result)
        print(
            f"gpu-check: no GPU found (torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
            f"no step applies: {'; '.join(STEP_NAMES)}. Run it on a host with an NVIDIA GPU."
        )
        print("\n" + render(result), flush=True)
        return EXIT_OK
    harness = Harness(out=out, quick=args.quick, gpu=gpu, gpus=result["gpus"], epochs=args.epochs)
    if args.deadline is None:  # every step this hardware allows, with a quarter to spare
        rows = plan(harness, STEPS, getattr(args, "only", None))
        runnable = [s for s, r in zip(STEPS, rows) if not r["left_out"]]
        # and the last step's start: a child is started with at least MIN_START_SECONDS and its stop's seconds left
        args.deadline = deadline_for(runnable, harness.gpus, args.quick) + MIN_START_SECONDS + math.ceil(STOP_SECONDS)
        result["deadline_seconds"] = args.deadline
        started = time.monotonic()  # made for the steps: it counts from the first (a given one bounds everything)
    harness.deadline_at = started + args.deadline
    try:
        outcomes = run_steps(harness, STEPS, result, args)
    except Terminated:
        print(f"gpu-check: stopped by SIGTERM; {out / 'gpu-check.json'} holds the steps that finished", file=sys.stderr)
        return EXIT_FAILED
    print("\n" + render(result), flush=True)
    return exit_code(outcomes)


def run_steps(
    harness: Harness, steps: tuple[Step, ...], result: dict[str, Any], args: argparse.Namespace
) -> list[Outcome]:
    """The plan printed, then each step in order; gpu-check.json rewritten after every one."""
    rows = plan(harness, steps, getattr(args, "only", None), args.deadline)
    result.update(plan=rows, expected_seconds=sum(r["expected_seconds"] for r in rows), finished=False, steps=[])
    print(render_plan(rows, args.deadline, harness.quick), flush=True)
    _write(args, harness.out, result)
    outcomes: list[Outcome] = []
    previous = signal.getsignal(signal.SIGTERM)
    _on_sigterm(_terminate)
    try:
        for step, row in zip(steps, rows):
            outcomes += _one(step, row, harness, args.deadline)
            result["steps"] = [asdict(o) for o in outcomes]
            result["verdict"] = overall(o.verdict for o in outcomes)
            _write(args, harness.out, result)
        result["finished"] = True
    finally:
        _on_sigterm(previous)
        _write(args, harness.out, result)  # on Ctrl-C or SIGTERM too: every finished step is kept
    return outcomes


def _one(step: Step, row: dict[str, Any], h: Harness, deadline: float) -> list[Outcome]:
    if row["left_out"]:
        return [Outcome(name, row["left_out"], row["why"]) for name in step.names]
    if h.seconds_left() - STOP_SECONDS < MIN_START_SECONDS:
        why = f"deadline: the check's {deadline:.0f} s were spent before this step (--deadline)"
        return [Outcome(name, NOT_RUN, why, by_deadline=True) for name in step.names]
    print(f"gpu-check: {step.name} ...", flush=True)
    h.step_limit = step.limit
    begun = time.perf_counter()
    cut = False
    try:
        done = step.run(h)
    except DeadlineCut as exc:  # started, and stopped by the deadline before it could say: not run to its end
        done, cut = Outcome(step.name, NOT_RUN, str(exc)), True
    except StepFailed as exc:
        done = Outcome(step.name, FAILED, str(exc))
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        done = Outcome(step.name, FAILED, f"{type(exc).__name__}: {first}")
    done = done if isinstance(done, list) else [done]
    if cut and len(done) < len(step.names):  # the lines it could not reach are the deadline's too
        done += [Outcome(name, NOT_RUN, "deadline: not reached", by_deadline=True) for name in step.names[1:]]
    for outcome in done:
        outcome.seconds = time.perf_counter() - begun
        outcome.by_deadline = outcome.by_deadline or cut
    return done


def _terminate(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM's handler while the steps run: it ends the check as Ctrl-C does (run_steps writes what finished)."""
    raise Terminated(f"signal {signum}")


def _on_sigterm(handler: Callable[[int, FrameType | None], Any] | int | None) -> None:
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


def _write(args: argparse.Namespace, out: Path, result: dict[str, Any]) -> None:
    from lab.run.training import runs

    runs.write_json(out / "gpu-check.json", result)
    if args.json:
        runs.write_json(args.json, result)
