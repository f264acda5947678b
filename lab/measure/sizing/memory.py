"""Memory per device under DDP and under sharding (ZeRO-1/2/3, FSDP), estimated and measured.

    lab memory --params 7e9 --world-size 8 --device h100
    lab memory --convention deepspeed --params 7e9 --world-size 8 --largest-layer 131e6   # DeepSpeed's formulas
    lab memory --measure                     # ResNet-18: estimate beside measurement, DDP and FSDP

The measurement itself (the training jobs, the bytes counted) is lab.measure.sizing.memory_measured's.

Bytes per parameter by convention (lab.measure.sizing.conventions): zero (the ZeRO paper: 16 for mixed Adam), hf
(Hugging Face's anatomy: 18), and deepspeed (DeepSpeed's own estimators: lab.measure.sizing.deepspeed_estimate).

Sharding over N ranks (ZeRO paper, Rajbhandari et al. 2020): ZeRO-1 divides the optimizer state by N, ZeRO-2
also the gradients, ZeRO-3 / FSDP full shard also the parameters; FSDP hybrid shard does full sharding inside a
node of M devices and replicates across nodes. In fp32 training DeepSpeed keeps an fp32 master copy of each
rank's partition and FSDP2 does not, so "ZeRO-3" and "FSDP full shard" are two rows there.

>>> rows = estimate(7e9, 8, "adam", "bf16", "zero")
>>> [(r["strategy"], round(r["total_bytes"] / 1e9, 3)) for r in rows]
[('DDP', 112.0), ('ZeRO-1', 38.5), ('ZeRO-2', 26.25), ('ZeRO-3 / FSDP full shard', 14.0)]
>>> [(r["strategy"], round(r["total_bytes"] / 1e9, 3)) for r in estimate(7e9, 8, "adam", "bf16", "hf")][1:]
[('ZeRO-1', 28.0), ('ZeRO-2', 28.0), ('ZeRO-3 / FSDP full shard', 15.75)]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.measure.sizing import deepspeed_estimate
from lab.measure.sizing.conventions import OPTIMIZER_STATE_BYTES, bytes_per_parameter, parts

__all__ = ["OPTIMIZER_STATE_BYTES", "bytes_per_parameter", "estimate", "recommend", "render", "run"]

# What --measure trains: fp32 parameters and gradients, SGD with momentum (the lab's own optimizer).
MEASURED_RECIPE = ("sgd-momentum", "fp32", "zero")
# Device memory as NVIDIA sells it, in its decimal GB (1e9 bytes). The lab fits against these bytes: torch
# reports more (torch.cuda.get_device_properties(0).total_memory is CUDA's totalGlobalMem: 85,045,477,376 bytes
# = 79.2 GiB on an H100 80GB HBM3 in the deviceQuery output kept in github.com/thamada/nvidia-smi,
# nvsim/H100SXMx8_deviceQuery.py), so the decimal figure errs on the safe side by about 6%.
DEVICES_GB = {"h100": 80.0, "h200": 141.0, "a100-80": 80.0, "a100-40": 40.0}
TORCH_REPORTS = {"h100": 85_045_477_376}  # total_memory where a published reading is cited above
# Part of the device kept free for the CUDA context, allocator fragmentation and NCCL's buffers, which the
# estimate does not count: the same 10% as lab.measure.sizing.choose.HEADROOM (tests/unit/test_memory.py holds them
# equal).
HEADROOM = 0.1
# DDP's bucket_cap_mb default and the lab's dist.bucket_cap_mb, which lab.run.training.strategies.deepspeed turns
# into DeepSpeed's reduce_bucket_size (DeepSpeed's own default is 5e8 elements: 1.86 GiB in fp32).
BUCKET_MIB = 25.0
PARTS = ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes")


def activation_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, layers: int) -> float:
    """Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per transformer layer (16-bit, no recomputation)."""
    s, b, h, a = seq_len, micro_batch, hidden, heads
    return layers * s * b * h * (34 + 5 * a * s / h)


def plans(world_size: int, precision: str, node_size: int | None) -> list[tuple[str, int, int, bool, bool]]:
    """(row, ZeRO stage its sharding equals, ranks it shards over, keeps DeepSpeed's fp32 master copy, holds
    DeepSpeed's IPG bucket) per row, in the order the recommendation walks them (least sharding first)."""
    n = world_size
    rows = [("DDP", 0, 1, False, False), ("ZeRO-1", 1, n, True, True), ("ZeRO-2", 2, n, True, True)]
    if node_size and 1 < node_size < n:
        rows.append((f"FSDP hybrid shard (node of {node_size})", 3, node_size, False, False))
    if precision == "fp32":  # the fp32 master copy tells them apart (lab.measure.sizing.conventions.parts)
        return rows + [("FSDP full shard", 3, n, False, False), ("ZeRO-3", 3, n, True, True)]
    return rows + [("ZeRO-3 / FSDP full shard", 3, n, False, True)]


def estimate(
    params: float,
    world_size: int,
    optimizer: str,
    precision: str,
    convention: str,
    node_size: int | None = None,
    activations: float = 0.0,
    bucket_bytes: float = BUCKET_MIB * 2**20,
) -> list[dict[str, Any]]:
    """One row per strategy: bytes per device of each column and their total. `bucket_bytes` (DeepSpeed's IPG
    bucket, reduce_bucket_size) is its own key, not in the total: ZeRO-2 holds it through each backward, ZeRO-1
    from the backward to the step (it reduces in the step), ZeRO-3 for the whole run (measured: lab bench
    strategies); DDP's buckets are its gradients (gradient_as_bucket_view=true, the lab's default; false adds a
    copy of the gradients); FSDP2 reduce-scatters one unit's gradients at a time."""
    rows = []
    for name, stage, ranks, master_copy, ipg in plans(world_size, precision, node_size):
        row: dict[str, Any] = {
            "strategy": name,
            "parameters_bytes": 0.0,
            "gradients_bytes": 0.0,
            "optimizer_states_bytes": 0.0,
            "activations_bytes": activations,
        }
        for part in parts(optimizer, precision, convention, fp32_master_copy=master_copy):
            row[f"{part.column}_bytes"] += params * part.bytes / (ranks if stage >= part.sharded_from else 1)
        row["total_bytes"] = sum(row[k] for k in PARTS)
        row["bucket_bytes"] = float(bucket_bytes) if ipg else 0.0
        rows.append(row)
    return rows


def usable(device_bytes: float, headroom: float = HEADROOM) -> float:
    """Bytes the training state may take: the device less the part kept free."""
    return device_bytes * (1 - headroom)


def recommend(rows: list[dict[str, Any]], device_bytes: float, headroom: float = HEADROOM) -> str:
    """The lecture's decision tree: DDP if it fits, else the least sharding that fits, else more parallelism.
    Fits: at most (1 - headroom) of the device, the part the table's note tells the user to keep free."""
    room = usable(device_bytes, headroom)
    if rows and "options" in rows[0]:  # DeepSpeed's rows: its stages and offloads
        fitting = sorted((r for r in rows if r["gpu_bytes"] <= room), key=deepspeed_estimate.preference)
        if fitting:
            return (
                f"{fitting[0]['strategy']} ({fitting[0]['options']}): the least sharding and offload that fits "
                f"in {1 - headroom:.0%} of the device (its per-CPU figure must fit the node's RAM)"
            )
        return "nothing fits, even with every offload: add GPUs, or tensor or pipeline parallelism"
    for row in rows:
        if row["total_bytes"] <= room:
            if row["strategy"] == "DDP":
                return f"DDP: the whole training state fits in {1 - headroom:.0%} of each device; no sharding needed"
            return f"{row['strategy']}: the least sharding that fits in {1 - headroom:.0%} of the device"
    return (
        "nothing fits: add tensor or pipeline parallelism (or activation checkpointing / CPU offload) "
        "on top of full sharding"
    )


def render(rows: list[dict[str, Any]], title: str, device_bytes: float | None, headroom: float = HEADROOM) -> str:
    room = None if device_bytes is None else usable(device_bytes, headroom)
    if rows and "options" in rows[0]:
        return deepspeed_estimate.render(rows, title, room)
    lines = [
        f"Memory per device: {title}.",
        "",
        "| strategy | parameters | gradients | optimizer states | activations "
        "| total per device | fits | bucket buffer (not in total) |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        fits = "-" if room is None else ("yes" if r["total_bytes"] <= room else "no")
        lines.append(
            f"| {r['strategy']} | {_gb(r['parameters_bytes'])} | {_gb(r['gradients_bytes'])} | "
            f"{_gb(r['optimizer_states_bytes'])} | {_gb(r['activations_bytes'])} | "
            f"{_gb(r['total_bytes'])} | {fits} | {_mib(r.get('bucket_bytes', 0))} |"
        )
    kept = f"{headroom:.0%}" if room is None else f"{headroom:.0%}: fits = total <= {room:,.0f} bytes"
    lines += [
        "",
        f"GB = 1e9 bytes. Kept free for the CUDA context, allocator fragmentation and NCCL buffers: {kept}. "
        "Bucket buffer: DeepSpeed's IPG bucket (reduce_bucket_size, set from dist.bucket_cap_mb), held "
        "through each backward at ZeRO-2, until the step at ZeRO-1, for the whole run at ZeRO-3; DDP's "
        "buckets are its gradients (gradient_as_bucket_view=true), FSDP2 has none of its own.",
    ]
    return "\n".join(lines)


def _gb(value: float) -> str:
    if not value:
        return "-"
    return f"{value / 1e9:.2f} GB" if value >= 1e7 else f"{value / 1e6:.2f} MB"


def _mib(value: float) -> str:
    return f"{value / 2**20:g} MiB" if value else "-"  # a bucket is set in MiB (bucket_cap_mb)


# ----------------------------------------------------------------------------- the command


def run(args: argparse.Namespace) -> int:
    from lab import plots
    from lab.run.training import runs

    if args.params <= 0:
        raise LabError(f"--params {args.params:g}: the parameter count must be positive, e.g. 7e9")
    if args.world_size < 1:
        raise LabError(f"--world-size {args.world_size}: need at least 1 device")
    if args.node_size is not None and args.node_size < 1:
        raise LabError(f"--node-size {args.node_size}: need at least 1 device per node")
    headroom = getattr(args, "headroom", HEADROOM)
    bucket_mib = getattr(args, "bucket_mb", BUCKET_MIB)
    if bucket_mib < 0:
        raise LabError(f"--bucket-mb {bucket_mib:g}: a bucket size in MiB, 0 or more (default {BUCKET_MIB:g})")
    device_gb = args.device_memory or (DEVICES_GB[args.device] if args.device else None)
    transformer = [args.seq_len, args.micro_batch, args.hidden, args.heads, args.layers]
    if any(v is not None for v in transformer) and not all(v is not None and v > 0 for v in transformer):
        raise LabError(
            "--seq-len, --micro-batch, --hidden, --heads, --layers: give all five (positive) for the "
            "activation term, or none"
        )
    activations = activation_bytes(*transformer) if transformer[0] is not None else 0.0
    largest_layer = getattr(args, "largest_layer", None)
    if args.convention == "deepspeed":
        rows, title, per_param = _deepspeed(args, activations, largest_layer)
    else:
        if largest_layer is not None:
            raise LabError(
                "--largest-layer: only --convention deepspeed uses it (its ZeRO-3 formula); "
                "drop it or add --convention deepspeed"
            )
        rows = estimate(
            args.params,
            args.world_size,
            args.optimizer,
            args.precision,
            args.convention,
            args.node_size,
            activations,
            bucket_mib * 2**20,
        )
        per_param = sum(bytes_per_parameter(args.optimizer, args.precision, args.convention))
        title = (
            f"{args.params:.3g} parameters, {args.world_size} devices, {args.optimizer}, {args.precision}, "
            f"{per_param} bytes/parameter ({args.convention} convention)"
        )
    device_bytes = device_gb * 1e9 if device_gb else None
    print(render(rows, title, device_bytes, headroom))
    advice = recommend(rows, device_bytes, headroom) if device_bytes else None
    if advice:
        assert device_bytes is not None  # advice comes only with a device size
        print(f"recommendation for {args.device or 'a device'} ({device_gb:g} GB): {advice}")
        reported = TORCH_REPORTS.get(args.device) if not args.device_memory else None
        print(
            f"device: {device_gb:g} GB = {device_bytes:,.0f} bytes (the vendor's decimal GB"
            + (f"; torch's total_memory reads {reported:,} on an {args.device.upper()}" if reported else "")
            + f"); {headroom:.0%} kept free: {usable(device_bytes, headroom):,.0f} bytes for the training state"
        )
    result: dict[str, Any] = {
        "benchmark": "memory",
        "title": title,
        "params": args.params,
        "world_size": args.world_size,
        "optimizer": args.optimizer,
        "precision": args.precision,
        "convention": args.convention,
        "bytes_per_parameter": per_param,
        "rows": rows,
        "device_memory_gb": device_gb,
        "device_memory_bytes": device_bytes,
        "headroom": headroom,
        "recommendation": advice,
    }
    if args.measure:
        result["measured"] = measured_beside_estimate(args.measure_width)
        print(render_measured(result["measured"]))
    if args.json:
        runs.write_json(args.json, result)
    if args.plot:
        plots.memory_bars(rows, device_gb, title, Path(args.plot))
    return 0


def _deepspeed(
    args: argparse.Namespace, activations: float, largest_layer: float | None
) -> tuple[list[dict[str, Any]], str, int]:
    """DeepSpeed's rows, after refusing what its estimator does not model."""
    if args.optimizer not in ("adam", "adamw") or args.precision == "fp32":
        raise LabError(
            f"--convention deepspeed with --optimizer {args.optimizer} --precision {args.precision}: "
            "DeepSpeed's estimator assumes mixed-precision Adam; use --optimizer adam and --precision "
            "bf16 or fp16, or --convention zero"
        )
    if activations:
        raise LabError(
            "--convention deepspeed: DeepSpeed's estimator counts model states only; drop --seq-len, "
            "--micro-batch, --hidden, --heads, --layers, or use --convention zero"
        )
    if args.plot:
        raise LabError(
            "--plot with --convention deepspeed: the bars split parameters, gradients and optimizer state, "
            "which DeepSpeed's estimator does not give; drop --plot or use --convention zero"
        )
    if largest_layer is not None and not 0 <= largest_layer <= args.params:
        raise LabError(
            f"--largest-layer {largest_layer:g}: the parameters of the largest layer, between 0 and "
            f"--params ({args.params:g})"
        )
    rows = deepspeed_estimate.rows(args.params, args.world_size, args.node_size, largest_layer)
    per_node, nodes = deepspeed_estimate.layout(args.world_size, args.node_size)
    layer = (
        f"largest layer {largest_layer:.3g} parameters"
        if largest_layer is not None
        else "largest layer 0 (not given: --largest-layer PARAMS adds 4 bytes each to ZeRO-3's GPU figure)"
    )
    title = (
        f"{args.params:.3g} parameters, {nodes} node(s) x {per_node} GPUs, mixed-precision Adam, "
        f"2 + 18/N bytes/parameter (deepspeed convention, deepspeed 0.19.8's formulas), {layer}"
    )
    return rows, title, 20  # DeepSpeed's 2 + 18 bytes per parameter, unsharded


# ----------------------------------------------------------------------------- beside a measurement


def measured_beside_estimate(width: int) -> dict[str, Any]:
    """lab.measure.sizing.memory_measured's counts (one process, then 2 ranks), and the estimate of the same recipe
    on 2 ranks."""
    from lab.measure.sizing import memory_measured

    result = memory_measured.measure(width)
    params = result["single"]["parameter_count"]
    result["estimate"] = {r["strategy"]: r for r in estimate(params, 2, *MEASURED_RECIPE)}
    # The key FSDP's estimate had before fp32's ZeRO-3 and FSDP rows were two (notebooks/05 reads it)
    result["estimate"]["ZeRO-3 / FSDP full shard"] = result["estimate"]["FSDP full shard"]
    return result


def render_measured(m: dict[str, Any]) -> str:
    single, params = m["single"], m["single"]["parameter_count"]
    estimate_1 = estimate(params, 1, *MEASURED_RECIPE)[0]["total_bytes"]
    what = (
        "torch.cuda.max_memory_allocated"
        if single["device"] == "cuda"
        else "bytes of parameter, gradient and optimizer-state tensors"
    )
    lines = [
        f"Measured: ResNet-18 ({params / 1e6:.2f}M parameters), SGD with momentum, fp32; measured = {what}.",
        "",
        f"1 process: estimate {_gb(estimate_1)}, measured {_gb(single['measured_bytes'])}, "
        f"ratio {single['measured_bytes'] / estimate_1:.2f}",
    ]
    two = m["two_ranks"]
    if "error" in two:
        lines += ["", f"2 ranks: {two['error']}"]
        return "\n".join(lines)
    lines += [
        "",
        "| 2 ranks | parameters | gradients | optimizer states | total per rank | estimate | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, key in (("DDP", "DDP"), ("FSDP (fully_shard)", "FSDP full shard")):
        if name.startswith("FSDP") and "fsdp_error" in two:
            lines.append(f"| FSDP | {two['fsdp_error']} | | | | | |")
            continue
        r, est = two["ddp" if name == "DDP" else "fsdp"], m["estimate"][key]["total_bytes"]
        lines.append(
            f"| {name} | {_gb(r['parameters_bytes'])} | {_gb(r['gradients_bytes'])} | "
            f"{_gb(r['optimizer_states_bytes'])} | {_gb(r['total_bytes'])} | {_gb(est)} | "
            f"{r['total_bytes'] / est:.2f} |"
        )
    return "\n".join(lines)
