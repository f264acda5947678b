"""The device check's runs that train a path once and say whether it held: the doctor, FSDP, bf16, DDP on one rank
(and compiled), a few epochs, determinism and resume. Each is a real `lab` command in a child, through
lab.run.cluster.runner (which stops its process group on its time limit, the deadline or a signal), and each run must
learn. The measurements are in lab.machine.devicecheck.bench_steps, what both share in lab.machine.devicecheck.harness,
and
`lab.machine.devicecheck.command` holds the table that orders them, the plan, the deadline and the command; a step knows
only its Harness (where to write, how big, how long its child may take).
"""

from __future__ import annotations

import json
import time
from typing import Any

from lab.machine.devicecheck.harness import (
    Harness,
    Outcome,
    StepFailed,
)
from lab.verdict import FAILED, HELD


def _losses(rows: list[dict[str, Any]]) -> str:
    return f"{rows[-1]['step']} steps, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}"


def _bf16(c: Harness, run_id: str) -> None:
    amp = c.manifest(run_id)["amp"]
    if amp != "bfloat16":
        raise StepFailed(f"run {run_id} trained with amp {amp}, not bfloat16")


# ----------------------------------------------------------------------------- the steps


def doctor(c: Harness) -> Outcome:
    c.lab("doctor", "doctor", "--json", str(c.out / "doctor.json"), "--output-dir", str(c.out))
    checks = json.loads((c.out / "doctor.json").read_text())["checks"]
    advised = [k["name"] for k in checks if k.get("fix")]  # the doctor exits 1 when one failed: these held
    return Outcome(
        "doctor", HELD, f"{len(checks)} checks" + (f"; a fix to make: {', '.join(advised)}" if advised else "")
    )


def fsdp(c: Harness) -> Outcome:
    """FSDP2 with bf16 on one rank: the fused optimizer on DTensors and BatchNorm under the mixed-precision
    policy are the two ways it broke on CUDA; both show in the first step."""
    rows = c.train("fsdp", "fsdp", "dist.strategy=fsdp", "train.amp=bf16", *c.short, "checkpoint.save=false")
    backend = c.backend("fsdp")
    _bf16(c, "fsdp")
    return Outcome("FSDP", HELD, f"{backend} process group of 1, FSDP2 fully_shard, bf16: {_losses(rows)}")


def bf16_training(c: Harness) -> Outcome:
    rows = c.train("bf16", "bf16", "train.amp=bf16", *c.short, "checkpoint.save=false")
    _bf16(c, "bf16")
    return Outcome("bf16 training", HELD, f"bf16 autocast, no process group: {_losses(rows)}")


def one_rank_ddp(c: Harness, compiled: bool) -> Outcome:
    name = "DDP + compile" if compiled else "DDP, 1 rank"
    run_id = "ddp-1rank-compiled" if compiled else "ddp-1rank"
    extra = ["model.compile=true", "dist.static_graph=true"] if compiled else ["train.grad_accum_steps=2"]
    rows = c.train(run_id, run_id, "dist.single_process_group=true", *c.short, "checkpoint.save=false", *extra)
    backend = c.backend(run_id)
    what = "torch.compile (DDPOptimizer), static_graph" if compiled else "gradient accumulation 2 (no_sync)"
    return Outcome(name, HELD, f"{backend} process group of 1, DDP, {what}: {_losses(rows)}")


def training(c: Harness, epochs: int) -> Outcome:
    started = time.perf_counter()
    c.train("training", "training", f"train.epochs={1 if c.quick else epochs}", "checkpoint.save=false")
    summary = json.loads((c.out / "runs" / "training" / "summary.json").read_text())
    wall = time.perf_counter() - started
    return Outcome(
        "training",
        HELD,
        f"{summary['steps']} steps in {wall:.1f} s (process start included), "
        f"{summary['samples_per_second'] or 0:,.0f} images/s",
        figures=summary,
    )


def deterministic_and_resume(c: Harness) -> list[Outcome]:
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
    first = HELD if a[:4] == b[:4] else FAILED
    outcomes.append(
        Outcome(
            "deterministic",
            first,
            "two runs, bit-identical losses over 4 steps" if first == HELD else f"losses differ: {a[:4]} vs {b[:4]}",
        )
    )
    second = HELD if len(b) == 8 and a[4:] == b[4:] else FAILED
    outcomes.append(
        Outcome(
            "resume",
            second,
            "stopped at step 4, resumed: steps 5-8 bit-identical to the run that was not stopped"
            if second == HELD
            else f"losses differ: {a[4:]} vs {b[4:]}",
        )
    )
    return outcomes


def exercise(c: Harness) -> Outcome:
    """`lab exercise check convert` on the reference solution: the grader's observer on the learner's path (nccl,
    one rank per GPU, where the host has a GPU for each of the 3 ranks the check runs; else gloo, said so)."""
    from lab.course.exercises import folder

    result = c.out / "exercise-convert.json"
    c.lab("exercise", "exercise", "check", "convert", str(folder("convert") / "solution.py"), "--json", str(result))
    doc = json.loads(result.read_text())
    runs = next(check["detail"] for check in doc["checks"] if check["name"] == "runs on 3 ranks")
    expected = "nccl" if c.gpus >= 3 else "gloo"
    if f"over {expected}" not in runs:
        raise StepFailed(f"the solution's ranks did not use {expected}: {runs}")
    held = sum(check["verdict"] == HELD for check in doc["checks"])
    why = "" if c.gpus >= 3 else f" ({c.gpus} GPU here: 3 ranks need 3, so the CPU path)"
    detail = f"the convert solution: {held} of {len(doc['checks'])} checks held over {expected}{why}, " + (
        f"{doc['seconds']:.0f} s"
    )
    figures = {"convert": doc}
    if c.gpus >= OWN_DDP_GPUS:
        own, figures["own-ddp"] = own_ddp(c)
        sync, figures["fix-batchnorm"] = fix_batchnorm(c)
        detail += f"; {own}; {sync}"
    return Outcome("exercise", HELD, detail, figures=figures)


OWN_DDP_GPUS = 2  # own-ddp's check runs 2, 3 and 4 ranks: with 2 GPUs its 2-rank run is NCCL's; with 1, none is


def own_ddp(c: Harness) -> tuple[str, dict[str, Any]]:
    """`lab exercise check own-ddp` on the reference solution, on a host with GPUs for its NCCL runs: every check
    held (the overlap read from the learner's waits, which on NCCL are the compute stream's order), each world size
    over the backend its GPUs allow. A CPU host leaves it to the CPU tests (gloo), which grade it there."""
    from lab.course.exercises import folder

    result = c.out / "exercise-own-ddp.json"
    c.lab("own-ddp", "exercise", "check", "own-ddp", str(folder("own-ddp") / "solution.py"), "--json", str(result))
    doc = json.loads(result.read_text())
    checks = {check["name"]: check for check in doc["checks"]}
    for n in (2, 3, 4):
        backend = "nccl" if c.gpus >= n else "gloo"
        if f"over {backend}" not in checks[f"runs on {n} ranks"]["detail"]:
            raise StepFailed(f"own-ddp's {n} ranks did not use {backend}: {checks[f'runs on {n} ranks']['detail']}")
    held = sum(check["verdict"] == HELD for check in doc["checks"])
    overlap = next(v["detail"] for k, v in checks.items() if k.startswith("stage 2") and "overlap" in k)
    on_nccl = [n for n in (2, 3, 4) if c.gpus >= n]
    return (
        f"own-ddp's solution: {held} of {len(checks)} held, {', '.join(map(str, on_nccl))} ranks over nccl; "
        f"stage 2 overlap: {overlap.split(' in flight')[0]}",
        doc,
    )


def fix_batchnorm(c: Harness) -> tuple[str, dict[str, Any]]:
    """`lab exercise check fix-batchnorm` on the reference solution over NCCL (2 ranks, 2 GPUs): SyncBatchNorm's
    statistics against the global batch's, replayed from the observer's per-channel sums of CUDA inputs. A CPU
    host leaves it to the CPU tests, which grade the solution's all-reduced BatchNorm over gloo."""
    from lab.course.exercises import folder

    result = c.out / "exercise-fix-batchnorm.json"
    c.lab(
        "fix-batchnorm",
        "exercise",
        "check",
        "fix-batchnorm",
        str(folder("fix-batchnorm") / "solution.py"),
        "--json",
        str(result),
    )
    doc = json.loads(result.read_text())
    checks = {check["name"]: check for check in doc["checks"]}
    if "over nccl" not in checks["ends cleanly"]["detail"]:
        raise StepFailed(f"fix-batchnorm's 2 ranks did not use nccl: {checks['ends cleanly']['detail']}")
    failed = [f"{n}: {check['detail']}" for n, check in checks.items() if check["verdict"] != HELD]
    if failed:
        raise StepFailed(f"fix-batchnorm's solution (SyncBatchNorm) failed on GPUs: {'; '.join(failed)}")
    global_batch = checks["the statistics of the global batch"]["detail"]
    return f"fix-batchnorm's solution (SyncBatchNorm) over nccl: {global_batch.split(': ', 1)[-1]}", doc
