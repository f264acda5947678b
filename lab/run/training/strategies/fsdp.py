"""Fully sharded data parallel (FSDP2, `fully_shard`): each rank keeps 1/N of the parameters, gradients and
optimizer state, and gathers a unit's parameters just before it computes.

The units are ResNet-18's four stages and the root (stem, head): a unit's parameters are all-gathered
for its forward and again for its backward, its gradients reduce-scattered after it, as torchtitan
shards a transformer block by block. What differs from DDP:

| lab setting            | under fsdp                                                                  |
|------------------------|-----------------------------------------------------------------------------|
| train.amp bf16         | FSDP's MixedPrecisionPolicy: bf16 compute, float32 reduce-scatter (no autocast) |
|                        | and float32 logits; each BatchNorm its own float32 unit (FSDP1's precedent)  |
| train.amp fp16         | refused: FSDP2 has no sharded GradScaler in the lab; use bf16                |
| train.grad_accum_steps | no reduce-scatter and no re-sharding between micro-batches, only after the last |
| data.uneven join       | refused: FSDP has no Join; pad or drop keep every rank's step count equal    |
| checkpoints            | torch.distributed.checkpoint: every rank writes its shards into one folder   |
| dist.* DDP knobs       | bucket_cap_mb, gradient_as_bucket_view, broadcast_buffers: DDP's own; unused |

A checkpoint folder holds DCP's shard files and metadata and the trainer's part (trainer.pt, by rank 0).
DCP re-shards on load, so a run may resume at another world size when the step plan allows it (the
trainer refuses a checkpoint whose total steps differ). Across nodes, run.output_dir must be one shared
file system: each rank writes its own shard files and rank 0 the metadata that every rank reads.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from lab import compat
from lab.errors import CheckpointError, LaunchError
from lab.run.cluster import dist
from lab.run.cluster.dist import DistContext
from lab.run.config import Config
from lab.run.training import checkpoint, optim
from lab.run.training.strategies.base import Strategy

if TYPE_CHECKING:  # for the checker only: a build that predates the public name has it under _composable
    from torch.distributed.fsdp import FSDPModule

TRAINER_PART = checkpoint.TRAINER_PART  # written last: its presence marks a whole checkpoint


class FSDPStrategy(Strategy):
    name = "fsdp"
    forward_is_collective = True  # every forward all-gathers: evaluation must run the same batches on every rank

    def __init__(self, cfg: Config, ctx: DistContext, model: nn.Module, amp_dtype: torch.dtype | None = None) -> None:
        _refuse_what_fsdp_cannot_do(cfg, ctx)
        from torch.distributed.fsdp import MixedPrecisionPolicy

        super().__init__(ctx, model)
        self.mixed_precision = amp_dtype == torch.bfloat16  # train.amp as lab.run.training.optim.choose_amp resolved it
        fully_shard = compat.fully_shard()
        # fully_shard takes contiguous parameters only ("FSDP does not support non-contiguous parameters yet": torch
        # 2.11 on an H200 with model.channels_last, the device check's first GPU run). The weights go back to NCHW;
        # the inputs stay channels_last, and that is enough for cuDNN's NHWC kernels (a convolution takes
        # channels_last when its input or its weight is).
        for param in model.parameters():
            if not param.is_contiguous():
                param.data = param.data.contiguous()
        self.float32_units = _shard_batchnorm_in_float32(model, fully_shard) if self.mixed_precision else []
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if self.mixed_precision
            else MixedPrecisionPolicy()
        )
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
            fully_shard(stage, mp_policy=policy)
        # The root: stem, pooling and the classifier. Its logits leave in float32, so the loss is computed in
        # float32 as under autocast (bf16 logits would round the log-softmax and widen the gap to DDP).
        root = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32)
            if self.mixed_precision
            else policy
        )
        fully_shard(model, mp_policy=root)
        self.forward = torch.compile(model) if cfg.model.compile else model

    def autocast(self, amp_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
        # With a mixed-precision policy FSDP casts the gathered parameters itself; autocast on top would cast again.
        return contextlib.nullcontext() if self.mixed_precision else super().autocast(amp_dtype)

    @contextlib.contextmanager
    def accumulating(self, sync: bool) -> Iterator[None]:
        if sync:
            yield
            return
        # Before the last micro-batch: keep the unsharded gradients (no reduce-scatter) and the gathered
        # parameters (no re-shard, so the next forward need not all-gather them again); both resume at the last.
        sharded = cast("FSDPModule", self.model)  # fully_shard swapped the model's class for an FSDPModule subclass
        sharded.set_requires_gradient_sync(False)
        sharded.set_reshard_after_backward(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)
            sharded.set_reshard_after_backward(True)

    def uneven_inputs(self, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # data.uneven=join is refused at set-up: every rank takes every step

    def describe(self) -> dict[str, Any]:
        described = {
            "strategy": self.name,
            "fsdp_units": ["layer1", "layer2", "layer3", "layer4", "root"],
            "fsdp_mixed_precision": "bf16 parameters, float32 reduction and logits" if self.mixed_precision else "off",
        }
        if self.float32_units:
            described["fsdp_float32_units"] = self.float32_units  # BatchNorm, each its own unit (below)
        return described

    # ------------------------------------------------------------------------- checkpoints

    def checkpoint_path(self, checkpoints: Path) -> Path:
        path = checkpoints / "fsdp"
        if self.ctx.is_primary:  # asked before a resume: a crash mid-replace left the last whole one aside
            _recover(path)
        return path

    def save(self, path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, optimizer)  # this rank's shards
        # A new folder beside the last one; the last is replaced only once the new one is whole.
        staging = path.with_name(path.name + ".next")
        if self.ctx.is_primary:
            shutil.rmtree(staging, ignore_errors=True)
        dist.barrier(self.ctx)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(staging))
        dist.barrier(self.ctx)  # every rank's shards are written
        if self.ctx.is_primary:
            checkpoint.save(staging / TRAINER_PART, state)  # last: its presence marks a whole checkpoint
            _replace_folder(staging, path)
        dist.barrier(self.ctx)  # nobody goes on (or saves again) before the folder is in place

    def load(
        self, path: Path, optimizer: torch.optim.Optimizer, check: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        state = dist.primary_then_broadcast(self.ctx, lambda: _read_trainer_part(path))
        check(state)
        if not (path / ".metadata").exists():
            raise CheckpointError(
                f"{path}: no DCP metadata on this node; an FSDP checkpoint across nodes needs "
                f"run.output_dir on a file system every node shares"
            )
        model_state, optimizer_state = get_state_dict(self.model, optimizer)
        dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))  # re-shards
        with optim.own_kernels(optimizer):
            set_state_dict(self.model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
        return state


def _shard_batchnorm_in_float32(model: nn.Module, fully_shard: Callable) -> list[str]:
    """Each BatchNorm its own unit, parameters kept float32; returns their names. FSDP1's MixedPrecision did
    the same (_module_classes_to_ignore=(_BatchNorm,)): in a bf16 unit its weights would be bf16 while its
    running statistics stay float32, a mix batch_norm refuses ('expected scalar type BFloat16 but found
    Float'), and statistics averaged in bf16 would drift. Its input is left as it comes (the convolution's
    bf16 output): batch_norm takes a bf16 input with float32 weights and statistics on CPU and CUDA, and
    returns bf16 to the next bf16 convolution. Shard these before their stages: a unit takes only the
    parameters no inner unit holds. Cost: two small all-gathers and one reduce-scatter more per BatchNorm."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.nn.modules.batchnorm import _BatchNorm

    keep = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
    names = [name for name, module in model.named_modules() if isinstance(module, _BatchNorm)]
    for name in names:
        fully_shard(model.get_submodule(name), mp_policy=keep)
    return names


def _refuse_what_fsdp_cannot_do(cfg: Config, ctx: DistContext) -> None:
    """What this process cannot do (the config's own refusals are lab.run.config's, before any process starts)."""
    if not ctx.distributed:
        raise LaunchError(
            "dist.strategy: fsdp needs a process group; lab.run.cluster.dist builds one for it, even at one rank"
        )
    if ctx.device.type == "cpu" and not compat.fsdp_runs_on_cpu():
        raise LaunchError(
            f"dist.strategy: fsdp on CPU tensors needs torch.cpu.Stream.record_event, which torch "
            f"{torch.__version__} lacks; use a newer torch, GPUs, or dist.strategy=ddp"
        )


def _read_trainer_part(path: Path) -> dict[str, Any]:
    part = path / TRAINER_PART
    if not part.exists():
        raise CheckpointError(
            f"{path}: not a whole FSDP checkpoint ({TRAINER_PART} missing); resume from another "
            f"or set checkpoint.resume=never"
        )
    return checkpoint.load(part, map_location="cpu")


def _replace_folder(new: Path, target: Path) -> None:
    """Put folder `new` at `target`: a directory cannot be renamed over a non-empty one, so the old one steps
    aside first; a crash between the two renames leaves `target.prev` whole, which `_recover` puts back."""
    previous = target.with_name(target.name + ".prev")
    shutil.rmtree(previous, ignore_errors=True)
    if target.exists():
        target.rename(previous)
    new.rename(target)
    shutil.rmtree(previous, ignore_errors=True)


def _recover(target: Path) -> None:
    """After a crash between `_replace_folder`'s renames: the previous whole checkpoint goes back in place."""
    previous = target.with_name(target.name + ".prev")
    if not target.exists() and (previous / TRAINER_PART).exists():
        previous.rename(target)
