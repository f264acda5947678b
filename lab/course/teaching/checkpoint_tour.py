"""What is inside a lab checkpoint, and proof that its model loads without the trainer: the workshop's
look at the baseline's `checkpoints/last.pt` between its two halves.

    tour = describe("runs/<workshop>/baseline/checkpoints/last.pt")
    print(render(tour))

A checkpoint that resumes a run exactly holds more than the weights: the optimizer's momentum, the
learning-rate schedule, where in which epoch the run stopped, every random generator's state and
the facts a resume must match. The model's part is the plain module's state dict (no `module.`
prefix), so it loads into a ResNet-18 built without DDP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# What each top-level part holds, in the course's words.
PARTS = {
    "model": "the weights and BatchNorm statistics (state_dict of the plain model)",
    "optimizer": "SGD's momentum buffer per parameter and its settings",
    "scheduler": "the learning-rate schedule's position",
    "scaler": "the fp16 loss scale (empty without fp16)",
    "progress": "optimizer steps done, epoch, step within the epoch",
    "data": "the sampler's seed and shuffle setting: the resumed run draws the same batches",
    "rng": "Python, NumPy and torch random states (augmentation continues as it would have)",
    "compat": "what a resume must match: model, global batch, schedule length, data size",
    "world_size": "ranks that wrote it",
    "strategy": "the strategy that wrote it (ddp: one file by rank 0)",
    "config": "the whole run configuration",
    "format": "the lab's checkpoint format number",
}


def describe(path: str | Path) -> dict[str, Any]:
    """The checkpoint's parts with their sizes, its progress, and whether a plain model takes its weights."""
    import torch

    from lab.run.config import ModelConfig
    from lab.run.training import checkpoint
    from lab.run.training import model as models

    path = Path(path)
    state = checkpoint.load(path)
    weights = state["model"]
    tensors = {k: v for k, v in weights.items() if isinstance(v, torch.Tensor)}
    loads = None
    if "config" in state:
        plain = models.build(ModelConfig(**state["config"]["model"]))  # no DDP wrapper around it
        try:
            plain.load_state_dict(weights, strict=True)
            loads = "yes"
        except RuntimeError as exc:
            loads = f"no: {str(exc).splitlines()[0][:160]}"
    return {
        "path": str(path),
        "bytes": path.stat().st_size,
        "progress": state.get("progress"),
        "world_size": state.get("world_size"),
        "strategy": state.get("strategy"),
        "parts": {key: PARTS.get(key, "") for key in state},
        "model_tensors": len(tensors),
        "model_values": sum(t.numel() for t in tensors.values()),
        "module_prefix": any(k.startswith("module.") for k in weights),
        "momentum_buffers": sum(1 for s in state["optimizer"]["state"].values() if "momentum_buffer" in s),
        "loads_into_plain_model": loads,
    }


def render(tour: dict[str, Any]) -> str:
    p = tour["progress"] or {}
    lines = [
        f"{tour['path']}: {tour['bytes'] / 1e6:.1f} MB, written by rank 0 of {tour['world_size']} "
        f"({tour['strategy']}) at step {p.get('step')} (epoch {p.get('epoch')}, step {p.get('step_in_epoch')} "
        f"within it).",
        "",
        "| part | what it holds |",
        "|---|---|",
    ]
    lines += [f"| {key} | {what} |" for key, what in tour["parts"].items()]
    lines += [
        "",
        f"model: {tour['model_tensors']} tensors, {tour['model_values']:,} values; keys with a `module.` "
        f"prefix: {'yes' if tour['module_prefix'] else 'none'}; loads into a plain ResNet-18 "
        f"(strict): {tour['loads_into_plain_model']}. optimizer: {tour['momentum_buffers']} momentum buffers.",
    ]
    return "\n".join(lines)
