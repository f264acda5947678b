"""`lab memory --convention deepspeed`: DeepSpeed's own model-state estimators, reproduced to the byte.

The formulas are those of deepspeed 0.19.8 (no import: DeepSpeed is an optional extra; tests/unit/test_memory_
deepspeed.py compares with the installed functions):
- runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs: per GPU 2Ψ + int(18Ψ/N) (2 = 16-bit
  parameters; 18 = 16-bit and fp32 gradients, fp32 master weights, Adam's two moments), or 2Ψ with the
  optimizer offloaded; per CPU (of a node) 4Ψ x GPUs per node x 1.5, or Ψ x max(4N, 16) x 1.5 offloaded.
  DeepSpeed has no stage-1 estimator: its ZeRO-1 and ZeRO-2 share this one.
- runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs: per GPU 4 x largest layer + int(18Ψ/N), less
  with offloads; per CPU by offload and zero_init. The largest layer is the one module whose own parameters
  are the most (its gathered 16-bit weights and gradients).
1.5 is DeepSpeed's additional_buffer_factor default. Mixed-precision Adam only. DeepSpeed prints GiB (2**30
bytes) labelled "GB"; this table says GiB and gives the bytes.

>>> [(r["strategy"], r["options"], r["gpu_bytes"]) for r in rows(7e9, 8, None, None)[:2]]
[('ZeRO-1/2', 'offload_optimizer=cpu', 14000000000), ('ZeRO-1/2', 'offload_optimizer=none', 29750000000)]
"""

from __future__ import annotations

from typing import Any

from lab.errors import LabError

BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor default, for the CPU column
GIB = 2**30


def zero2(
    total_params: int,
    gpus_per_node: int,
    nodes: int,
    cpu_offload: bool,
    additional_buffer_factor: float = BUFFER_FACTOR,
) -> tuple[int, int]:
    """(per CPU, per GPU) bytes: estimate_zero2_model_states_mem_needs, the same arithmetic in the same order."""
    total_gpus = nodes * gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def zero3(
    total_params: int,
    largest_layer_params: int,
    gpus_per_node: int,
    nodes: int,
    cpu_offload: bool,
    cpu_offload_params: bool,
    zero_init: bool,
    additional_buffer_factor: float = BUFFER_FACTOR,
) -> tuple[int, int, int]:
    """(per CPU, per GPU, largest layer) bytes: estimate_zero3_model_states_mem_needs, the same arithmetic."""
    total_gpus = nodes * gpus_per_node
    gpus_factor = 1 / nodes
    largest_layer_memory = 4 * largest_layer_params
    # Written as DeepSpeed writes it, product by product: the float rounding, then int(), must be the same
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def layout(world_size: int, node_size: int | None) -> tuple[int, int]:
    """(GPUs per node, nodes): --node-size is GPUs per node here (default: all on one node)."""
    per_node = node_size or world_size
    if world_size % per_node:
        raise LabError(
            f"--world-size {world_size} --node-size {per_node}: DeepSpeed's estimator takes whole nodes; "
            f"give a --world-size that is a multiple of --node-size"
        )
    return per_node, world_size // per_node


def rows(params: float, world_size: int, node_size: int | None, largest_layer: float | None) -> list[dict[str, Any]]:
    """Every line DeepSpeed's two `..._all_cold` functions print, in their order: ZeRO-2 (offload_optimizer
    cpu, none), then ZeRO-3 (offload_param and offload_optimizer cpu/none, zero_init 1/0)."""
    per_node, nodes = layout(world_size, node_size)
    total = round(params)  # a parameter count: DeepSpeed's model_to_params sums integers
    largest = round(largest_layer or 0)
    out = []
    for offload in (True, False):
        cpu, gpu = zero2(total, per_node, nodes, offload)
        out.append(_row("ZeRO-1/2", f"offload_optimizer={'cpu' if offload else 'none'}", cpu, gpu, 2))
    for offload in (True, False):
        for offload_params in (True, False):
            if not offload and offload_params:
                continue
            for zero_init in (True, False):
                cpu, gpu, _ = zero3(total, largest, per_node, nodes, offload, offload_params, zero_init)
                options = (
                    f"offload_param={'cpu' if offload_params else 'none'}, "
                    f"offload_optimizer={'cpu' if offload else 'none'}, zero_init={int(zero_init)}"
                )
                out.append(_row("ZeRO-3", options, cpu, gpu, 3))
    return out


def _row(strategy: str, options: str, cpu: int, gpu: int, stage: int) -> dict[str, Any]:
    # total_bytes: what must fit on the device (the recommendation and the fits column read it)
    return {
        "strategy": strategy,
        "zero_stage": stage,
        "options": options,
        "gpu_bytes": gpu,
        "cpu_bytes": cpu,
        "total_bytes": gpu,
    }


def preference(row: dict[str, Any]) -> tuple[int, int, int]:
    """Order of preference: less sharding first, then less offloading (each costs step time), zero_init last."""
    options = row["options"]
    return row["zero_stage"], options.count("=cpu"), "zero_init=0" in options


def render(rows_: list[dict[str, Any]], title: str, usable_bytes: float | None) -> str:
    lines = [
        f"DeepSpeed's estimate: {title}.",
        "",
        "| ZeRO stage | options | per GPU | per CPU (a node) | fits |",
        "|---|---|---:|---:|---|",
    ]
    for r in rows_:
        fits = "-" if usable_bytes is None else ("yes" if r["gpu_bytes"] <= usable_bytes else "no")
        lines.append(f"| {r['strategy']} | {r['options']} | {_gib(r['gpu_bytes'])} | {_gib(r['cpu_bytes'])} | {fits} |")
    lines += [
        "",
        'GiB = 2**30 bytes (DeepSpeed prints these GiB labelled "GB"); model states only, as DeepSpeed '
        "counts them (no activations, no buffers beyond its 1.5 factor on the CPU column).",
    ]
    return "\n".join(lines)


def _gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB ({value:,} bytes)"
