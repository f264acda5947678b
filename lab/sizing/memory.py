"""Memory per device under DDP and under sharding (ZeRO-1/2/3, FSDP), estimated and measured.

    lab memory --params 7e9 --world-size 8 --device h100
    lab memory --measure                     # ResNet-18: estimate beside measurement, DDP and FSDP

Bytes per parameter (parameters, gradients, optimizer state):
- fp32:                   4, 4, and the optimizer's fp32 state (Adam 8, SGD momentum 4, SGD 0)
- mixed, convention zero: 2, 2, 4 (fp32 master weights) + state  -> 16 for Adam, as in the ZeRO paper
- mixed, convention hf:   6 (fp32 + 16-bit copy), 4 (fp32), state -> 18 for Adam, as in Hugging Face's
                          "model memory anatomy"

Sharding over N ranks (ZeRO paper, Rajbhandari et al. 2020): ZeRO-1 divides the optimizer
state by N, ZeRO-2 also the gradients, ZeRO-3 / FSDP full shard also the parameters; FSDP
hybrid shard does full sharding inside a node of M devices and replicates across nodes.

>>> rows = estimate(7e9, 8, "adam", "bf16", "zero")
>>> [(r["strategy"], round(r["total_bytes"] / 1e9, 3)) for r in rows]
[('DDP', 112.0), ('ZeRO-1', 38.5), ('ZeRO-2', 26.25), ('ZeRO-3 / FSDP full shard', 14.0)]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from lab.errors import LabError

OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}  # fp32 state per parameter
# What --measure trains: fp32 parameters and gradients, SGD with momentum (the lab's own optimizer).
MEASURED_RECIPE = ("sgd-momentum", "fp32", "zero")
DEVICES_GB = {"h100": 80.0, "h200": 141.0, "a100-80": 80.0, "a100-40": 40.0}


def bytes_per_parameter(optimizer: str, precision: str, convention: str) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes per parameter."""
    state = OPTIMIZER_STATE_BYTES[optimizer]
    if precision == "fp32":
        return 4, 4, state
    if convention == "zero":
        return 2, 2, 4 + state  # the fp32 master weights count as optimizer state, as ZeRO shards them
    return 6, 4, state


def activation_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int, layers: int) -> float:
    """Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per transformer layer (16-bit, no recomputation)."""
    s, b, h, a = seq_len, micro_batch, hidden, heads
    return layers * s * b * h * (34 + 5 * a * s / h)


def estimate(params: float, world_size: int, optimizer: str, precision: str, convention: str,
             node_size: int | None = None, activations: float = 0.0) -> list[dict[str, Any]]:
    p, g, o = (params * x for x in bytes_per_parameter(optimizer, precision, convention))
    n = world_size
    plans = [("DDP", 1, 1, 1), ("ZeRO-1", 1, 1, n), ("ZeRO-2", 1, n, n)]
    if node_size and 1 < node_size < n:
        plans.append((f"FSDP hybrid shard (node of {node_size})", node_size, node_size, node_size))
    plans.append(("ZeRO-3 / FSDP full shard", n, n, n))
    rows = []
    for name, dp, dg, do in plans:
        row = {"strategy": name, "parameters_bytes": p / dp, "gradients_bytes": g / dg,
               "optimizer_states_bytes": o / do, "activations_bytes": activations}
        row["total_bytes"] = sum(row[k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes",
                                                  "activations_bytes"))
        rows.append(row)
    return rows


def recommend(rows: list[dict[str, Any]], device_bytes: float) -> str:
    """The lecture's decision tree: DDP if it fits, else the least sharding that fits, else more parallelism."""
    for row in rows:
        if row["total_bytes"] <= device_bytes:
            if row["strategy"] == "DDP":
                return "DDP: the whole training state fits on each device; no sharding needed"
            return f"{row['strategy']}: the least sharding that fits"
    return ("nothing fits: add tensor or pipeline parallelism (or activation checkpointing / CPU offload) "
            "on top of full sharding")


def render(rows: list[dict[str, Any]], title: str, device_bytes: float | None) -> str:
    lines = [f"Memory per device: {title}.", "", "| strategy | parameters | gradients | optimizer states | activations | total per device "
             "| fits |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        fits = "-" if device_bytes is None else ("yes" if r["total_bytes"] <= device_bytes else "no")
        lines.append(f"| {r['strategy']} | {_gb(r['parameters_bytes'])} | {_gb(r['gradients_bytes'])} | "
                     f"{_gb(r['optimizer_states_bytes'])} | {_gb(r['activations_bytes'])} | "
                     f"{_gb(r['total_bytes'])} | {fits} |")
    lines += ["", "GB = 1e9 bytes; no headroom is reserved for the CUDA context, allocator fragmentation or NCCL "
                 "buffers: keep about 10% free."]
    return "\n".join(lines)


def _gb(value: float) -> str:
    if not value:
        return "-"
    return f"{value / 1e9:.2f} GB" if value >= 1e7 else f"{value / 1e6:.2f} MB"


# ----------------------------------------------------------------------------- the command


def run(args) -> int:
    from lab import plots
    from lab.training import runs

    if args.params <= 0:
        raise LabError(f"--params {args.params:g}: the parameter count must be positive, e.g. 7e9")
    if args.world_size < 1:
        raise LabError(f"--world-size {args.world_size}: need at least 1 device")
    if args.node_size is not None and args.node_size < 1:
        raise LabError(f"--node-size {args.node_size}: need at least 1 device per node")
    device_gb = args.device_memory or (DEVICES_GB[args.device] if args.device else None)
    transformer = [args.seq_len, args.micro_batch, args.hidden, args.heads, args.layers]
    if any(v is not None for v in transformer) and not all(v is not None and v > 0 for v in transformer):
        raise LabError("--seq-len, --micro-batch, --hidden, --heads, --layers: give all five (positive) for the "
                       "activation term, or none")
    activations = activation_bytes(*transformer) if transformer[0] is not None else 0.0
    rows = estimate(args.params, args.world_size, args.optimizer, args.precision, args.convention, args.node_size,
                    activations)
    per_param = sum(bytes_per_parameter(args.optimizer, args.precision, args.convention))
    title = (f"{args.params:.3g} parameters, {args.world_size} devices, {args.optimizer}, {args.precision}, "
             f"{per_param} bytes/parameter ({args.convention} convention)")
    print(render(rows, title, device_gb * 1e9 if device_gb else None))
    advice = recommend(rows, device_gb * 1e9) if device_gb else None
    if advice:
        print(f"recommendation for {args.device or 'a device'} ({device_gb:g} GB): {advice}")
    result: dict[str, Any] = {"benchmark": "memory", "title": title, "params": args.params,
                              "world_size": args.world_size, "optimizer": args.optimizer,
                              "precision": args.precision, "convention": args.convention,
                              "bytes_per_parameter": per_param, "rows": rows, "device_memory_gb": device_gb,
                              "recommendation": advice}
    if args.measure:
        result["measured"] = measure(args.measure_width)
        print(render_measured(result["measured"]))
    if args.json:
        runs.write_json(args.json, result)
    if args.plot:
        plots.memory_bars(rows, device_gb, title, Path(args.plot))
    return 0


# ----------------------------------------------------------------------------- measurement


def measure(width: int) -> dict[str, Any]:
    """ResNet-18 trained a few steps: one process, then 2 ranks with DDP and with FSDP (fully_shard)."""
    from lab.cluster import launch, runner

    runner.check_processes(2, "lab memory --measure")  # its 2-rank job: refused before the first process starts
    with tempfile.TemporaryDirectory() as tmp:
        single = Path(tmp) / "single.json"
        done = runner.run([sys.executable, "-m", "lab.sizing.memory", "--worker", str(single), str(width)],
                          echo=False)
        if done.returncode != 0:  # its traceback is above
            raise RuntimeError(f"lab memory --measure: the 1-process measurement exited {done.returncode}")
        result = {"single": json.loads(single.read_text())}
        sharded = Path(tmp) / "sharded.json"
        command = launch.torchrun_command(2, ["-m", "lab.sizing.memory", "--worker", str(sharded), str(width)])
        if runner.run(command, env=launch.worker_env(2), processes=2, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL, echo=False).returncode == 0:
            result["two_ranks"] = json.loads(sharded.read_text())
        else:
            result["two_ranks"] = {"error": "the 2-rank DDP/FSDP measurement failed to run here"}
    params = result["single"]["parameter_count"]
    result["estimate"] = {r["strategy"]: r for r in estimate(params, 2, *MEASURED_RECIPE)}
    return result


def render_measured(m: dict[str, Any]) -> str:
    single, params = m["single"], m["single"]["parameter_count"]
    estimate_1 = estimate(params, 1, *MEASURED_RECIPE)[0]["total_bytes"]
    what = "torch.cuda.max_memory_allocated" if single["device"] == "cuda" else "bytes of parameter, gradient " \
        "and optimizer-state tensors"
    lines = [f"Measured: ResNet-18 ({params / 1e6:.2f}M parameters), SGD with momentum, fp32; measured = {what}.", "",
             f"1 process: estimate {_gb(estimate_1)}, measured {_gb(single['measured_bytes'])}, "
             f"ratio {single['measured_bytes'] / estimate_1:.2f}"]
    two = m["two_ranks"]
    if "error" in two:
        lines += ["", f"2 ranks: {two['error']}"]
        return "\n".join(lines)
    lines += ["", "| 2 ranks | parameters | gradients | optimizer states | total per rank | estimate | ratio |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, key in (("DDP", "DDP"), ("FSDP (fully_shard)", "ZeRO-3 / FSDP full shard")):
        if name.startswith("FSDP") and "fsdp_error" in two:
            lines.append(f"| FSDP | {two['fsdp_error']} | | | | | |")
            continue
        r, est = two["ddp" if name == "DDP" else "fsdp"], m["estimate"][key]["total_bytes"]
        lines.append(f"| {name} | {_gb(r['parameters_bytes'])} | {_gb(r['gradients_bytes'])} | "
                     f"{_gb(r['optimizer_states_bytes'])} | {_gb(r['total_bytes'])} | {_gb(est)} | "
                     f"{r['total_bytes'] / est:.2f} |")
    return "\n".join(lines)


def _train_and_count(model, ctx, steps: int = 3) -> dict[str, Any]:
    import torch

    from lab.training.strategies.base import tensor_bytes  # a DTensor (an FSDP shard) counts this rank's part only

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    for _ in range(steps):
        x = torch.randn(8, 3, 32, 32, device=ctx.device)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (8,), device=ctx.device))
        loss.backward()
        optimizer.step()  # gradients kept (no zero_grad after the last step): they are part of the footprint
        if _ != steps - 1:
            optimizer.zero_grad()
    params = list(model.parameters())
    counts = {"parameters_bytes": tensor_bytes(params),
              "gradients_bytes": tensor_bytes([p.grad for p in params if p.grad is not None]),
              "optimizer_states_bytes": tensor_bytes([v for s in optimizer.state.values() for v in s.values()
                                                       if torch.is_tensor(v)])}
    counts["total_bytes"] = sum(counts.values())
    counts["measured_bytes"] = (torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda"
                                else counts["total_bytes"])
    return counts


def worker(out: str, width: int) -> None:
    import torch

    from lab.cluster import dist

    from lab.training import model, runs
    from lab.config import DistConfig, ModelConfig

    with dist.initialized(DistConfig()) as ctx:
        torch.manual_seed(0)
        build = lambda: model.build(ModelConfig(width=width)).to(ctx.device)  # noqa: E731
        if not ctx.distributed:
            counts = _train_and_count(build(), ctx)
            counts.update(parameter_count=sum(p.numel() for p in build().parameters()), device=ctx.device.type)
            runs.write_json(out, counts)
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        result = {"ddp": _train_and_count(DDP(build()), ctx)}
        try:
            from lab.compat import fully_shard as fully_shard_of_this_torch

            fully_shard = fully_shard_of_this_torch()
            sharded = build()
            for stage in (sharded.layer1, sharded.layer2, sharded.layer3, sharded.layer4):
                fully_shard(stage)
            fully_shard(sharded)
            result["fsdp"] = _train_and_count(sharded, ctx)
        except Exception as exc:  # noqa: BLE001 - reported in one line, the DDP figures still stand
            result["fsdp_error"] = f"FSDP cannot run here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        # Every rank holds its own shard; rank 0's figures stand for all (shards are equal up to padding).
        if ctx.is_primary:
            runs.write_json(out, result)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2], int(sys.argv[3]))
