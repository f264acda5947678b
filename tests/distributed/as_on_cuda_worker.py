"""A test rank that trains each named case two steps with the optimizer built as on a GPU, and records it.

    torchrun --standalone --nproc-per-node 2 tests/distributed/as_on_cuda_worker.py OUT_DIR CASE [CASE ...]

No GPU here: lab.run.training.optim.build_optimizer is handed a CUDA device while the tensors stay on the CPU, so it
picks CUDA's kernel (fused SGD where the parameters allow it) and torch runs that kernel on CPU tensors
(fused SGD has a CPU kernel since torch 2.4). Everything else is the lab's own Trainer and strategies.
Each rank writes OUT_DIR/CASE-RANK.json: the optimizer's kernel flags, and for every loss the dtype of
the logits that reached it, the loss's dtype and its value, and the dtypes of BatchNorm's running statistics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lab.run import config, data
from lab.run.cluster import dist
from lab.run.training import optim
from lab.run.training.trainer import Trainer

COMMON = ["model.width=8", "data.synthetic_train_size=128", "data.synthetic_test_size=64", "train.warmup_steps=0"]
CASES = {
    "fsdp": ["dist.strategy=fsdp"],
    "zero1": ["dist.strategy=deepspeed", "dist.zero_stage=1"],
    "zero2": ["dist.strategy=deepspeed", "dist.zero_stage=2"],
    "zero3": ["dist.strategy=deepspeed", "dist.zero_stage=3"],
    "fsdp-bf16": ["dist.strategy=fsdp", "train.amp=bf16"],
    "zero2-bf16": ["dist.strategy=deepspeed", "dist.zero_stage=2", "train.amp=bf16"],
    "zero3-bf16": ["dist.strategy=deepspeed", "dist.zero_stage=3", "train.amp=bf16"],
}
STEPS = 2


def build_as_on_cuda(model, train, device):
    return REAL_BUILD(model, train, torch.device("cuda"))  # the flags a GPU run gets; the tensors stay put


REAL_BUILD = optim.build_optimizer


def train_case(name: str, ctx: dist.DistContext, out: Path) -> None:
    cfg = config.load("smoke", [*COMMON, *CASES[name]])
    trainer = Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device))
    losses: list[dict] = []
    criterion = trainer.criterion

    def recorded(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = criterion(logits, labels)
        losses.append({"logits": str(logits.dtype), "loss": str(loss.dtype), "value": loss.item()})
        return loss

    trainer.criterion = recorded  # type: ignore[assignment]  # any callable of (logits, labels) is a criterion
    batches = trainer.train_loader.epoch(0)
    for _ in range(STEPS):
        trainer.train_step(*next(batches))
    flags = {k: bool(trainer.optimizer.defaults[k]) for k in ("fused", "foreach")}  # SGD keeps None for unset
    running = [b for n, b in trainer.model.named_buffers() if n.endswith(("running_mean", "running_var"))]
    statistics = sorted({str(b.dtype) for b in running})
    (out / f"{name}-{ctx.global_rank}.json").write_text(
        json.dumps({"optimizer": flags, "losses": losses, "batchnorm_statistics": statistics})
    )


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    optim.build_optimizer = build_as_on_cuda  # the Trainer calls it through the module
    with dist.initialized(config.load("smoke", CASES[names[0]]).dist) as ctx:
        for name in names:
            train_case(name, ctx, out)


if __name__ == "__main__":
    main()
