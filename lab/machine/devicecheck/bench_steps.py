"""The device check's measurements: each times or counts something on this host's GPUs (host syncs in the step
loop, copies, the data path, memory against the estimate, the strategies, the levers, the collectives, the step
predicted on more GPUs, the exporter's cost, Lightning beside the lab) through a real `lab` command or
lab.machine.devicecheck.measure's child, and reports the figures with what it should reach. The runs that train a path
once
are in lab.machine.devicecheck.train_steps.
"""

from __future__ import annotations

import json
import math
import sys

from lab.machine.devicecheck.harness import (
    SYNC_BATCHNORM_SYNC,
    TARGET_DATA_RATIO,
    TARGET_IMAGES_PER_SECOND,
    TARGET_METRICS_OVERHEAD,
    DeadlineCut,
    Harness,
    Outcome,
    StepFailed,
    mark,
    set_args,
)
from lab.verdict import FAILED, HELD

# name, overrides of one guarded run of the host-syncs step. SyncBatchNorm needs a process group (1 rank here).
HOST_SYNC_VARIANTS = (
    ("bf16", "train.amp=bf16"),
    ("fp16", "train.amp=fp16"),
    ("sync_batchnorm", "train.amp=bf16,model.sync_batchnorm=true,dist.single_process_group=true"),
)


def host_syncs(c: Harness) -> Outcome:
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
            "lab.machine.devicecheck.measure",
            "host-syncs",
            "--config",
            c.config,
            *set_args(sets),
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
        HELD,
        f"bf16, fp16: none in {steps} steps under set_sync_debug_mode('error'); {shown}",
        figures=found,
    )


def host_device(c: Harness) -> Outcome:
    """`lab bench hostdevice` on this host's GPUs: pinned copies both ways per GPU and the GPU-to-GPU matrix, the
    figures `lab validate` judges (the CPU tests run the same code host to host, unpinned)."""
    r = c.bench("hostdevice", "--size", "64M" if c.quick else "256M", "--iters", "5" if c.quick else "20")
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
        HELD,
        f"{n} GPU(s), pinned, {r['size_bytes'] / 2**20:g} MiB (GB/s): "
        f"host->device {span([g['h2d_gbps'] for g in r['gpus']])}, device->host "
        f"{span([g['d2h_gbps'] for g in r['gpus']])}, within a GPU {span([d2d[i][i] for i in range(n)])}"
        + (f", GPU to GPU {span(pairs)}" if pairs else ""),
        figures=r,
    )


def data_path(c: Harness) -> Outcome:
    p = c.bench(
        "pipeline",
        *("--config", c.config, *c.fast),
        *("--batch-size", "64" if c.quick else "512", "--batches", "2" if c.quick else "50"),
        *("--rounds", "1" if c.quick else "3", "--num-workers", "0" if c.quick else "8"),
    )
    data, step = p["data_ratio_lab_over_torchvision"], p["train_ratio_lab_over_torchvision"]
    images = p["median_images_per_second"]["lab_train"]
    detail = (
        f"data alone {data:.1f}x the DataLoader path "
        f"(target {TARGET_DATA_RATIO:.0f}x: {mark(data >= TARGET_DATA_RATIO)}); "
        f"with the training step {step:.2f}x; {images:,.0f} training images/s"
    )
    if c.gpu and not c.quick:
        detail += f" (target {TARGET_IMAGES_PER_SECOND:,}: {mark(images >= TARGET_IMAGES_PER_SECOND)})"
    return Outcome("data path", HELD, detail, figures=p)


def memory(c: Harness) -> Outcome:
    """Model state measured like the estimate counts it: parameters, gradients and momentum, no activations."""
    from lab.measure.sizing.memory import MEASURED_RECIPE, estimate

    c.child(
        "memory",
        [
            sys.executable,
            "-m",
            "lab.machine.devicecheck.measure",
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
        HELD,
        f"model state {state / 1e6:.1f} MB measured / {expected / 1e6:.1f} MB "
        f"estimated = {ratio:.2f}; peak with activations and workspaces at batch 256: "
        f"{peak / 1e6:.0f} MB",
        figures={"state_bytes": state, "estimate_bytes": expected, "ratio": ratio, "peak_bytes": peak},
    )


def strategies(c: Harness) -> Outcome:
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
        HELD,
        f"{c.gpus} GPU(s), bf16: state per rank (MiB) {state}; largest loss gap "
        f"from DDP {max(r['loss_gap_from_ddp'] for r in ran):.1e}"
        + (f"; not installed: {', '.join(absent)}" if absent else ""),
        figures={"rows": rows},
    )


def levers(c: Harness) -> Outcome:
    """The levers where they matter: fp16 with its GradScaler, CUDA peak memory, and NCCL's variables."""
    result = c.bench("levers", "--nproc-per-node", str(c.gpus), "--steps", "5", "--rounds", "2")
    groups = result["groups"]
    ratios = ", ".join(f"{r['label']} {r['ratio_to_plain']:.2f}x" for r in groups["precision"] if "ratio_to_plain" in r)
    difference = groups["accumulation"]["equivalence"]["max_parameter_difference"]
    nccl = groups["nccl"]
    sweep = (
        ", ".join(f"{r['label']} {r['ratio_to_default']:.2f}x" for r in nccl["rows"] if r.get("ratio_to_default"))
        if nccl.get("applicable")
        else f"NCCL sweep not applicable ({nccl.get('reason', '')[:60]})"
    )
    state = HELD if difference < 1e-10 else FAILED
    return Outcome(
        "levers",
        state,
        f"images/s vs fp32: {ratios}; accumulation vs one batch (float64) {difference:.1e}; {sweep}",
        figures={"levers": result},
    )


def all_reduce(c: Harness) -> Outcome:
    # All six collectives in one job (NCCL's own reduce-scatter, alltoall and send/recv included); all-reduce's
    # figure leads, as nccl-tests' all_reduce_perf does in every cluster check.
    from lab.measure.bench.comm.collective import NAMES

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
        HELD,
        f"{c.gpus} GPUs: busbw {best['ip_busbw']:.0f} GB/s at "
        f"{best['size'] / 2**20:.0f} MiB, average {r['avg_busbw']:.0f} GB/s; average busbw of the other "
        f"collectives: {others} GB/s",
        figures=results,
    )


def metrics_overhead(c: Harness) -> Outcome:
    overhead = c.bench(
        "metrics-overhead",
        *("--config", c.config, *c.fast, "--rounds", "1" if c.quick else "3", "--steps", "4" if c.quick else "50"),
        result="overhead.json",
    )["overhead"]
    return Outcome(
        "metrics",
        HELD,
        f"exporter on vs off: {overhead:+.2%} (target <= +1%: {mark(overhead <= TARGET_METRICS_OVERHEAD)})",
        figures={"overhead": overhead},
    )


def hang_record(c: Harness) -> Outcome:
    """`lab bench hang-record`: every collective recorded (the Flight Recorder over NCCL on a GPU) and the
    watchdog, on vs off; the record must hold the run's collectives. 2 ranks where there are 2 GPUs (or on a
    CPU), else one rank in a 1-rank NCCL group."""
    ranks = 2 if c.gpus >= 2 or not c.gpu else 1
    alone = set_args(["dist.single_process_group=true"]) if ranks == 1 else []
    out = c.out / "hang-record.json"
    doc = c.bench(
        "hang-record",
        *("--config", c.config, *c.fast, *alone, "--nproc-per-node", str(ranks)),
        *("--rounds", "1" if c.quick else "2", "--steps", "3" if c.quick else "30"),
        *("--calls", "50" if c.quick else "500"),
    )
    expected = "nccl" if c.gpu else "gloo"
    if doc["backend"] != expected or not doc["record"] or "all_reduce" not in doc["recorded_ops"]:
        raise StepFailed(
            f"over {doc['backend']} (expected {expected}) the {doc['record'] or 'missing record'} held "
            f"{doc['recorded_ops'] or 'no collective'}; see {out}"
        )
    step = doc["step_ratio_on_over_off"]
    return Outcome(
        "hang record",
        HELD,
        f"{doc['record']} over {doc['backend']} ({ranks} rank(s)) held {', '.join(doc['recorded_ops'])}; time on/off: "
        f"a step {step:.3f} (target <= 1.01: {mark(step <= 1.01)}), a 4-byte all-reduce "
        f"{doc['allreduce_ratio_on_over_off']:.3f}",
        figures=doc,
    )


def lightning_peer(c: Harness) -> Outcome:
    """The lab's images/s over PyTorch Lightning's for the same ResNet-18, global batch and steps, in one run.
    bf16 on a GPU; fp32 at toy size on a CPU, where bf16 convolutions are ten times slower than fp32."""
    sets = [*c.common, "train.amp=bf16" if c.gpu else "train.amp=off"]  # its data, run folder and ids are its own
    r = c.bench("lightning", "--config", c.config, *set_args(sets), "--steps", "4" if c.quick else "50")
    return Outcome(
        "Lightning peer",
        HELD,
        f"the lab {r['lab_images_per_second']:,.0f} images/s, Lightning "
        f"{r['lightning_images_per_second']:,.0f}: {r['ratio_lab_over_lightning']:.2f}x "
        f"({'bf16' if c.gpu else 'fp32'}, same model, global batch and steps)",
        figures=r,
    )
