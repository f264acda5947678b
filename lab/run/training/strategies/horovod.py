"""Horovod: every rank holds the whole model, as under DDP; `hvd.DistributedOptimizer` all-reduces each
gradient as its backward produces it, from Horovod's background thread, fusing small tensors into one buffer.

The lecture's fourth tool, trained through the same seam as the other three. Launched by horovodrun
(`lab train --nproc-per-node N` starts `horovodrun --gloo`); Horovod's group carries the gradients, the lab's
torch.distributed group the rest (lab.run.cluster.horovod_rendezvous says why there are two). The build, with the
lab's patches to Horovod's last release: third_party/horovod/build.sh (docs/horovod.md).

| lab                             | Horovod                                                                    |
|---------------------------------|----------------------------------------------------------------------------|
| the same initial weights        | broadcast_parameters from rank 0 (why not the optimizer state: attach)     |
| the lab's SGD and schedule      | DistributedOptimizer(SGD, named_parameters, op=Average); the schedule as is|
| train.grad_accum_steps          | backward_passes_per_step: each gradient is reduced after its last pass     |
| train.amp bf16 / fp16           | torch.autocast as under DDP; fp16's GradScaler steps after synchronize()   |
| dist.bucket_cap_mb              | not mapped: Horovod's fusion buffer is HOROVOD_FUSION_THRESHOLD (64 MiB)   |
| checkpoints/last.pt             | rank 0 writes one file, as DDP; rank 0 reads it and broadcasts it          |
| dist.horovod_timeline_steps     | hvd.start_timeline over the first N steps: horovod-timeline.json           |
| refused by lab.run.config, one line | data.uneven=join, model.compile, model.sync_batchnorm, DDP's own keys    |

The optimizer: Horovod wraps an optimizer by building a new one of the same class over the same parameter
groups, with its own (empty) state. The Trainer and the schedule hold the lab's SGD; the wrapper is made to
share that SGD's groups and state (after a resume too), so a step of either is one step of the same weights,
and a checkpoint of the lab's SGD is the wrapper's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lab.errors import LaunchError
from lab.run.cluster.dist import DistContext
from lab.run.cluster.horovod_rendezvous import import_horovod
from lab.run.config import Config
from lab.run.observability import horovod_timeline
from lab.run.training import checkpoint
from lab.run.training.strategies.base import Strategy
from lab.run.training.strategies.ddp import load_replica, save_replica

if TYPE_CHECKING:  # Horovod ships no types: what hvd.DistributedOptimizer returns, for the checker only

    class _DistributedOptimizer(torch.optim.Optimizer):
        """A subclass of the wrapped optimizer's class that Horovod builds, with its all-reduce controls."""

        def synchronize(self) -> None: ...
        def skip_synchronize(self) -> contextlib.AbstractContextManager: ...


class HorovodStrategy(Strategy):
    name = "horovod"

    def __init__(self, cfg: Config, ctx: DistContext, model: nn.Module, amp_dtype: torch.dtype | None = None) -> None:
        hvd = self.hvd = import_horovod()
        hvd.init()  # met horovodrun's rendezvous already in lab.run.cluster.dist (a no-op then); alone: a world of 1
        if (hvd.rank(), hvd.size()) != (ctx.global_rank, ctx.world_size):
            raise LaunchError(
                f"dist.strategy: horovod: Horovod sees rank {hvd.rank()} of {hvd.size()}, the lab "
                f"rank {ctx.global_rank} of {ctx.world_size}; launch with horovodrun "
                f"(lab train --nproc-per-node N), not torchrun"
            )
        super().__init__(ctx, model)
        self.cfg = cfg
        self.optimizer: _DistributedOptimizer | None = None  # Horovod's wrapper of the Trainer's SGD (attach)
        self.timeline_path: Path | None = None
        self.timeline_steps_left = 0

    def observe(self, run_dir: Path | None) -> None:
        if run_dir is not None and self.cfg.dist.horovod_timeline_steps:
            self.timeline_path = run_dir / horovod_timeline.FILE

    def attach(self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        hvd = self.hvd
        # Each rank built the model from one seed already; broadcasting makes rank 0's weights the law, as DDP does.
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        # Not hvd.broadcast_optimizer_state on a fresh optimizer: to create the state it broadcasts, it steps the
        # optimizer once with zero gradients, and with weight decay that step moves every weight (by lr x wd x w)
        # and seeds momentum. Measured here: the first loss parts from DDP's (2.4932916 against 2.4933051) and
        # the curves by 3% after 16 steps. A fresh SGD's state is empty on every rank; a resumed one was read by
        # rank 0 and broadcast (load): equal everywhere either way, so there is nothing to broadcast.
        if optimizer.state:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=self.model.named_parameters(),
            op=hvd.Average,
            backward_passes_per_step=self.cfg.train.grad_accum_steps,
        )
        self._share(optimizer)
        if self.timeline_path is not None:  # after the broadcasts: the timeline shows training steps only
            hvd.start_timeline(str(self.timeline_path), mark_cycles=False)
            self.timeline_steps_left = self.cfg.dist.horovod_timeline_steps

    def _share(self, optimizer: torch.optim.Optimizer) -> None:
        """The wrapper steps the lab's SGD's groups and state (the schedule sets lr there; a resume loads there)."""
        assert self.optimizer is not None  # attach wrapped it before any load
        self.optimizer.param_groups = optimizer.param_groups
        self.optimizer.state = optimizer.state

    def accumulating(self, sync: bool) -> contextlib.AbstractContextManager:
        # Nothing to switch: backward_passes_per_step makes each gradient's hook wait for its last pass.
        return contextlib.nullcontext()

    def uneven_inputs(self, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # data.uneven=join is refused by lab.run.config: never enabled

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
    ) -> None:
        assert self.optimizer is not None  # the trainer attaches the optimizer before the first step
        self.optimizer.synchronize()  # every gradient all-reduced (averaged) before anything reads it
        with self.optimizer.skip_synchronize():  # fp16: the scaler unscales the averaged gradients, then steps
            scaler.step(self.optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if self.timeline_steps_left:
            self.timeline_steps_left -= 1
            if not self.timeline_steps_left:
                self.hvd.stop_timeline()

    def checkpoint_path(self, checkpoints: Path) -> Path:
        return checkpoints / checkpoint.LAST

    def save(self, path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        save_replica(self.ctx, self.model, path, optimizer, state)  # every rank holds the same, as under DDP

    def load(
        self, path: Path, optimizer: torch.optim.Optimizer, check: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        state = load_replica(self.ctx, self.model, path, optimizer, check)
        self._share(optimizer)  # load_state_dict made new group and state objects: share them again
        return state

    def describe(self) -> dict[str, Any]:
        import horovod

        return {
            "strategy": self.name,
            "horovod_version": horovod.__version__,
            "horovod_controller": "gloo" if self.hvd.gloo_built() and self.hvd.gloo_enabled() else "mpi",
            "horovod_gpu_operations": "nccl" if self.hvd.nccl_built() else None,
        }
