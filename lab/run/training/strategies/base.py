"""The seam every strategy fills: what a training step, its backward and its optimizer step call, and how the model's
and the optimizer's state are saved and restored (lab.run.training.strategies says what a strategy decides)."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lab.run.cluster.dist import DistContext


class Strategy(ABC):
    name: str
    # True when a forward pass communicates (sharded parameters are gathered): then every rank must run the
    # same number of forward passes, in evaluation too.
    forward_is_collective = False

    def __init__(self, ctx: DistContext, model: nn.Module) -> None:
        self.ctx = ctx
        self.model = model  # the plain module: parameters, buffers, evaluation, state
        self.forward: Callable[..., torch.Tensor] = model  # what a training step calls

    def observe(self, run_dir: Path | None) -> None:
        """Called once, before attach, with the run's directory (None when the run records nothing): a strategy
        may write its own records there (Horovod's timeline)."""

    def attach(self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        """Called once the trainer has built them from the config (DeepSpeed's engine takes both over)."""

    def autocast(self, amp_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
        """Around forward passes: torch.autocast to train.amp's dtype, unless the strategy casts itself."""
        from lab.run.training import optim

        return optim.autocast(self.ctx.device, amp_dtype)

    @abstractmethod
    def accumulating(self, sync: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward and backward; sync=False keeps its gradients local (all but the
        last micro-batch of an accumulated step)."""

    @abstractmethod
    def uneven_inputs(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Around an epoch in which ranks may take different numbers of steps."""

    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler) -> None:
        scaler.scale(loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
    ) -> None:
        """The end of an (accumulated) batch: new weights, the next learning rate, gradients cleared."""
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

    @abstractmethod
    def checkpoint_path(self, checkpoints: Path) -> Path:
        """Where this strategy's checkpoint lives in a run's checkpoints/ folder (a file or a folder)."""

    @abstractmethod
    def save(self, path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Write a checkpoint: `state` is the trainer's part (progress, schedule, RNG, what a resume must
        match); the strategy adds the model's and the optimizer's. Called on every rank: the strategy decides
        who writes what."""

    @abstractmethod
    def load(
        self, path: Path, optimizer: torch.optim.Optimizer, check: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        """Restore the model and `optimizer` from a checkpoint `save` wrote and return the trainer's part;
        `check(state)` sees the trainer's part first and may refuse the checkpoint before anything is loaded."""

    def communication_wait(self) -> float | None:
        """Seconds this rank spent in its last sampled step's gradient communication (transfer and waiting for
        the peers), read at a log interval; None where the strategy does not measure it (DDP's reducer does)."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the run manifest and summary record of the strategy."""
        return {"strategy": self.name}

    def memory_split(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes this rank holds in parameters, gradients and optimizer state (a sharded tensor counts its local
        shard only), for `lab bench strategies`; call it after a step with the gradients still there."""
        params = list(self.model.parameters())
        states = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return {
            "parameters_bytes": tensor_bytes(params),
            "gradients_bytes": tensor_bytes(p.grad for p in params if p.grad is not None),
            "optimizer_states_bytes": tensor_bytes(states),
        }


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of `tensors` on this rank: a DTensor (FSDP2's sharded parameter) counts its local shard."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total
