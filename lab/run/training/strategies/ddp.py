"""Distributed data parallel: every rank holds the whole model; gradients are all-reduced in buckets
during backward. At world size 1 (the baseline) there is no wrapper and no communication: the same
code path, so the baseline and DDP differ only in what DDP adds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

from lab import compat
from lab.errors import LaunchError
from lab.run.cluster import dist
from lab.run.cluster.dist import DistContext
from lab.run.config import Config
from lab.run.training import checkpoint, optim
from lab.run.training.strategies.base import Strategy


class DDPStrategy(Strategy):
    name = "ddp"

    def __init__(self, cfg: Config, ctx: DistContext, model: nn.Module, amp_dtype: torch.dtype | None = None) -> None:
        if cfg.model.sync_batchnorm:
            if ctx.device.type != "cuda":
                raise LaunchError(
                    f"model.sync_batchnorm: SyncBatchNorm runs only on CUDA devices in PyTorch; this "
                    f"run is on {ctx.device.type} ({ctx.backend or 'no process group'}); set "
                    f"model.sync_batchnorm=false, or model.norm=group for batch-independent norms"
                )
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        super().__init__(ctx, model)
        d = cfg.dist
        self.ddp: DistributedDataParallel | None = None
        if ctx.distributed:
            # The keyword's name depends on the torch release, so the checker cannot tell which parameter it fills.
            buffer_sync: dict[str, Any] = compat.ddp_buffer_sync(d.broadcast_buffers)
            self.ddp = DistributedDataParallel(
                model,
                device_ids=ctx.device_ids,
                bucket_cap_mb=d.bucket_cap_mb,
                gradient_as_bucket_view=d.gradient_as_bucket_view,
                static_graph=d.static_graph,
                **buffer_sync,
            )
        if self.ddp is not None:  # the reducer times one step in log_every: a straggler's lag, read at log time
            self.ddp._set_ddp_runtime_logging_sample_rate(max(1, cfg.train.log_every))
        network = self.ddp or model
        self.forward = torch.compile(network) if cfg.model.compile else network

    def communication_wait(self) -> float | None:
        if self.ddp is None:
            return None
        nanoseconds = self.ddp._get_ddp_logging_data().get("backward_comm_time")
        return nanoseconds / 1e9 if isinstance(nanoseconds, int) and nanoseconds > 0 else None

    def accumulating(self, sync: bool) -> contextlib.AbstractContextManager:
        # DDP all-reduces gradients during backward; no_sync skips it, the next synced backward carries them.
        return self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()

    def uneven_inputs(self, enabled: bool) -> contextlib.AbstractContextManager:
        # Join shadows the all-reduces of ranks that ran out of batches, so the others do not hang.
        return Join([self.ddp]) if enabled and self.ddp is not None else contextlib.nullcontext()

    def checkpoint_path(self, checkpoints: Path) -> Path:
        return checkpoints / checkpoint.LAST

    def save(self, path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        save_replica(self.ctx, self.model, path, optimizer, state)

    def load(
        self, path: Path, optimizer: torch.optim.Optimizer, check: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        return load_replica(self.ctx, self.model, path, optimizer, check)


def save_replica(
    ctx: DistContext, model: nn.Module, path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """The checkpoint of a strategy whose every rank holds the same weights and optimizer state (DDP, Horovod):
    one writer, one file. The plain module's state dict: no "module." prefix, so it loads into a model without DDP."""
    if ctx.is_primary:
        checkpoint.save(path, {**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()})


def load_replica(
    ctx: DistContext,
    model: nn.Module,
    path: Path,
    optimizer: torch.optim.Optimizer,
    check: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Rank 0 reads the file and sends it to the others: nodes need no shared file system. Every rank then loads
    the same state, so loading after the wrap keeps the ranks in step."""
    state = dist.primary_then_broadcast(ctx, lambda: checkpoint.load(path, map_location="cpu"))
    check(state)
    model.load_state_dict(state["model"])
    with optim.own_kernels(optimizer):
        optimizer.load_state_dict(state["optimizer"])
    return state
