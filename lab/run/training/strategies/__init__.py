"""How the model is wrapped, stepped and saved across ranks: the seam where data-parallel tools differ.

A strategy owns the wrapped model; the Trainer owns the loop, the data and the optimizer. What
a strategy decides: what a training step calls (`forward`), whether a micro-batch's backward
communicates (`accumulating`), how ranks with fewer batches keep up (`uneven_inputs`), how the
optimizer step runs, and how the model's and the optimizer's state are saved and restored. `build` picks one from the
config by its row in lab.run.config.strategies (a new strategy: a module here and a row there); DDP is the first, and
the world-size-1 baseline is DDP's code path without the wrapper.

    strategy = build(cfg, ctx, model)
    with strategy.accumulating(last_micro_batch), autocast:
        loss = criterion(strategy.forward(inputs), labels)
        strategy.backward(loss, scaler)
    strategy.step(optimizer, scheduler, scaler)
    strategy.save(strategy.checkpoint_path(run_dir.checkpoints), optimizer, trainer_state)
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from lab.run.cluster.dist import DistContext
from lab.run.config import Config
from lab.run.config.strategies import STRATEGIES
from lab.run.training.strategies.base import Strategy, tensor_bytes

__all__ = ["Strategy", "build", "tensor_bytes"]


def build(cfg: Config, ctx: DistContext, model: nn.Module, amp_dtype: torch.dtype | None = None) -> Strategy:
    """The strategy dist.strategy names (a row of lab.run.config.strategies), around `model` (on ctx.device);
    `amp_dtype` is train.amp as lab.run.training.optim.choose_amp resolved it (a strategy may cast parameters itself).
    Each is imported only when chosen: DeepSpeed is an optional extra."""
    row = STRATEGIES[cfg.dist.strategy]
    return getattr(importlib.import_module(row.module), row.class_name)(cfg, ctx, model, amp_dtype)
