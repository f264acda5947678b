"""DeepSpeed: a ZeRO engine (stage dist.zero_stage) steps and saves the model; the Trainer keeps its loop.

ZeRO-1 shards the optimizer state over ranks, ZeRO-2 also the gradients, ZeRO-3 also the parameters
(gathered for each module's forward and backward by hooks). The lab's SGD and LR schedule are handed
to `deepspeed.initialize`, which wraps them; the process group is the lab's own (DeepSpeed adopts
torch.distributed's default group: gloo on CPUs, NCCL on GPUs). The optional extra `lab[deepspeed]`.

| lab                             | DeepSpeed                                                                  |
|---------------------------------|----------------------------------------------------------------------------|
| batch per rank (training.plan)  | train_micro_batch_size_per_gpu; train_batch_size = it x accum x ranks      |
| train.grad_accum_steps          | gradient_accumulation_steps, managed_gradient_accumulation: false (below)  |
| dist.zero_stage                 | zero_optimization.stage; ZeRO-3 re-shards every parameter after use        |
| dist.bucket_cap_mb              | reduce_bucket_size, allgather_bucket_size (MiB -> elements)                |
| train.amp bf16 / fp16           | bf16 / fp16 enabled (weights; DeepSpeed's loss scaler for fp16); float32  |
|                                 | logits and BatchNorm (float32 weights and statistics, as under autocast)  |
| the lab's SGD and schedule      | optimizer=, lr_scheduler= (engine.step steps both); untested optimizer ok  |
| no clipping                     | gradient_clipping: 0                                                       |
| model.sync_batchnorm            | SyncBatchNorm on CUDA, as DDP; refused on CPU                              |
| dist.backend, timeout_seconds   | the lab's process group, which DeepSpeed adopts                            |
| checkpoints/deepspeed/latest    | save_checkpoint / load_checkpoint by tag, one shard per rank, + trainer.pt |
| refused by lab.run.config, one line | data.uneven=join, model.compile, model.dtype=float64, dist.static_graph,   |
|                                 | dist.broadcast_buffers=true, dist.gradient_as_bucket_view=false            |

Steps: the Trainer calls backward per micro-batch with the loss already divided by the accumulation
steps, and step once per optimizer step. DeepSpeed's unmanaged accumulation is exactly that contract:
`engine.backward(loss, scale_wrt_gas=False)` accumulates (ZeRO-2/3 reduce-scatter each micro-batch,
that is how they hold only a gradient shard), and `engine.step()` is the boundary: it reduces (ZeRO-1),
steps the optimizer, zeroes gradients and steps the schedule. So the update equals DDP's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from lab import atomic
from lab.errors import CheckpointError, LaunchError
from lab.run.cluster import dist
from lab.run.cluster.dist import DistContext
from lab.run.config import Config, batch_size_per_rank
from lab.run.training import checkpoint
from lab.run.training.strategies.base import Strategy

if TYPE_CHECKING:  # DeepSpeed, an optional extra, is imported where it is used
    from deepspeed import DeepSpeedEngine

POINTER = "latest"  # DeepSpeed's name: a text file naming the last complete tag folder
TRAINER_PART = checkpoint.TRAINER_PART  # beside DeepSpeed's files in each tag folder


class DeepSpeedStrategy(Strategy):
    name = "deepspeed"

    def __init__(self, cfg: Config, ctx: DistContext, model: nn.Module, amp_dtype: torch.dtype | None = None):
        # DeepSpeed picks its device once, at first use: make it the lab's (a CPU run on a GPU host too).
        os.environ.setdefault("DS_ACCELERATOR", ctx.device.type)
        try:  # here, not in attach: a missing DeepSpeed is said in one line before anything is built
            from deepspeed.accelerator import get_accelerator
        except ImportError:
            raise LaunchError(
                "dist.strategy: deepspeed needs DeepSpeed, missing here: DS_BUILD_OPS=0 pip install "
                "--no-build-isolation 'lab[deepspeed]' (as make does), or dist.strategy=ddp"
            ) from None
        if not ctx.distributed:  # lab.run.cluster.dist builds a group for every strategy but ddp, even at one rank
            raise LaunchError("dist.strategy: deepspeed needs a process group; run it under torchrun")
        if get_accelerator().device_name() != ctx.device.type:  # DS_ACCELERATOR set otherwise by the user
            raise LaunchError(
                f"DS_ACCELERATOR: DeepSpeed's device is {get_accelerator().device_name()}, this rank's "
                f"{ctx.device.type}; unset DS_ACCELERATOR"
            )
        if cfg.model.sync_batchnorm:
            if ctx.device.type != "cuda":
                raise LaunchError(
                    f"model.sync_batchnorm: SyncBatchNorm runs only on CUDA devices in PyTorch; this "
                    f"run is on {ctx.device.type}; set model.sync_batchnorm=false"
                )
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        super().__init__(ctx, model)  # self.model: the module; the engine wraps it, ZeRO-3 hooks live on it
        self.cfg, self.stage = cfg, cfg.dist.zero_stage
        self.forward_is_collective = self.stage == 3  # ZeRO-3 all-gathers in every forward, evaluation's too
        self.amp = (
            amp_dtype  # train.amp as lab.run.training.optim.choose_amp resolved it: DeepSpeed's bf16/fp16, or float32
        )
        if self.amp is not None:
            _batchnorm_in_float32(model)
        self.engine: DeepSpeedEngine | None = None  # built by attach
        self._saved: list[str] = []  # tags written; a second save at one step gets a new folder

    def ds_config(self) -> dict[str, Any]:
        cfg, world = self.cfg, self.ctx.world_size
        micro, accum = batch_size_per_rank(cfg, world), cfg.train.grad_accum_steps
        bucket = max(1, int(cfg.dist.bucket_cap_mb * 2**20 / (2 if self.amp else 4)))  # MiB -> elements
        zero = {"stage": self.stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
        if self.stage == 3:
            # Shard every parameter and re-shard it after use, as the lab's FSDP does. DeepSpeed's defaults keep
            # parameters below 1e5 elements whole (50 of ResNet-18's 62) and, below 1e9 live parameters, keep
            # gathered ones for reuse: ZeRO-3 would hold the whole model. Measured: a few % slower on CPU.
            zero.update(stage3_param_persistence_threshold=0, stage3_max_live_parameters=0, stage3_max_reuse_distance=0)
        return {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": accum,
            "train_batch_size": micro * accum * world,
            "managed_gradient_accumulation": False,  # the Trainer owns the boundary: backward each, step once
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0,
            "bf16": {"enabled": self.amp == torch.bfloat16},
            "fp16": {"enabled": self.amp == torch.float16, "loss_scale": 0},  # 0: dynamic loss scaling
            # No data_types.buffer_dtype: DeepSpeed casts only parameters, so BatchNorm's running statistics stay
            # float32, and _batchnorm_in_float32 hands batch_norm float32 weights to match them.
            "steps_per_print": None,
            "wall_clock_breakdown": False,
        }

    def attach(self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)  # its INFO lines, on every rank, would drown the lab's
        # ZeRO calls these torch.distributed names every step; torch's deprecation warning would repeat as often.
        warnings.filterwarnings(
            "ignore",
            r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` "
            r"is deprecated",
            FutureWarning,
        )
        # torch.distributed already holds the lab's group (lab.run.cluster.dist.init): DeepSpeed adopts it, makes none.
        # It asserts LOCAL_RANK, which a 1-rank group outside torchrun (plain `lab train`) has not.
        os.environ.setdefault("LOCAL_RANK", str(self.ctx.local_rank))
        # As it adopts the group on CPUs, DeepSpeed JIT-compiles a shared-memory all-reduce (deepspeed_shm_comm,
        # an inference op the lab never calls): minutes of C++ on a fresh machine, a failure without a compiler.
        # Its TorchBackend builds the op only where deepspeed.ops.__compatible_ops__ says it is compatible, a
        # dict DeepSpeed probes once and keeps (edits persist): marked incompatible, DeepSpeed keeps to gloo.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=self.ctx.backend, dist_init_required=False)
        self.engine, *_ = deepspeed.initialize(
            model=self.model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config()
        )
        self.forward = self.engine
        if self.amp is not None:
            # DeepSpeed's bf16/fp16 cast the weights, not the inputs: cast the images in and the logits out
            # (the loss in float32, as under autocast). On the module, so evaluation's plain call casts too.
            half = self.amp
            self.model.register_forward_pre_hook(lambda _m, args: tuple(a.to(half) for a in args))
            self.model.register_forward_hook(lambda _m, _args, out: out.float())

    def autocast(self, amp_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
        # The weights themselves are bf16/fp16 under DeepSpeed's precision: torch.autocast must not also run.
        return contextlib.nullcontext()

    def accumulating(self, sync: bool) -> contextlib.AbstractContextManager:
        # Nothing to switch: with unmanaged accumulation ZeRO-1 reduces in step(), ZeRO-2/3 in each backward
        # (a benchmark's sync=False cannot skip that, so it times the communication too).
        return contextlib.nullcontext()

    def uneven_inputs(self, enabled: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # data.uneven=join is refused by lab.run.config: never enabled

    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler) -> None:
        # The Trainer divided by the accumulation steps already; DeepSpeed's loss scaler replaces `scaler`.
        assert self.engine is not None  # the trainer attaches before the first step
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
    ) -> None:
        assert self.engine is not None  # the trainer attaches before the first step
        self.engine.step()  # reduce (ZeRO-1), optimizer step, zero the gradients, then the schedule's step

    def checkpoint_path(self, checkpoints: Path) -> Path:
        # The pointer: it exists once a save is whole, so checkpoint.resume=auto never takes a half-written one
        return checkpoints / "deepspeed" / POINTER

    def save(self, path: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        # A new tag folder per save; `latest` moves to it (atomically, by rank 0) only once every rank's
        # shards and the trainer's part are on disk, then older folders go: a crash leaves `latest` on a
        # whole checkpoint. All ranks write into one folder: nodes need a shared file system, as in DeepSpeed.
        path = _folder(path)
        assert self.engine is not None  # the trainer attaches before it saves
        tag = f"step{self.engine.global_steps}"
        tag = tag if tag not in self._saved else f"{tag}-{len(self._saved)}"
        self._saved.append(tag)
        self.engine.save_checkpoint(str(path), tag=tag, save_latest=False)
        dist.barrier(self.ctx)
        if self.ctx.is_primary:
            meta = {
                "tag": tag,
                "zero_stage": self.stage,
                "world_size": self.ctx.world_size,
                "precision": str(self.amp or torch.float32),
            }
            checkpoint.save(path / tag / TRAINER_PART, {**state, "deepspeed": meta})
            atomic.write_text(path / POINTER, tag + "\n")
            for old in path.iterdir():
                if old.is_dir() and old.name != tag:
                    shutil.rmtree(old, ignore_errors=True)
        dist.barrier(self.ctx)  # nobody reads or writes the folder again before rank 0 is done with it

    def load(
        self, path: Path, optimizer: torch.optim.Optimizer, check: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any]:
        path = _folder(path)  # checkpoint.resume may name the folder or its pointer

        def read() -> dict[str, Any]:
            if not (path / POINTER).is_file():
                raise CheckpointError(
                    f"{path}: not a DeepSpeed checkpoint of the lab (no {POINTER} file); give "
                    f"checkpoints/deepspeed of a run with dist.strategy=deepspeed"
                )
            return checkpoint.load(path / (path / POINTER).read_text().strip() / TRAINER_PART)

        state = dist.primary_then_broadcast(self.ctx, read)  # rank 0 reads, every rank checks the same
        check(state)  # the Trainer's checks first: nothing is loaded into a checkpoint that does not fit
        meta = state.get("deepspeed", {})
        now = {"zero_stage": self.stage, "precision": str(self.amp or torch.float32)}
        if meta.get("world_size") != self.ctx.world_size:
            # ZeRO shards are per rank; DeepSpeed's universal checkpoints would convert them (not wired here).
            raise CheckpointError(
                f"{path}: saved at world size {meta.get('world_size')}, this run has "
                f"{self.ctx.world_size}; resume with the same --nproc-per-node"
            )
        diffs = [f"{k} is {meta.get(k)} in the checkpoint but {v} now" for k, v in now.items() if meta.get(k) != v]
        if diffs:
            raise CheckpointError(f"{path}: does not fit this run: {'; '.join(diffs)}")
        # The Trainer restores the schedule from its own part right after: DeepSpeed's copy is not loaded.
        assert self.engine is not None  # the trainer attaches before it resumes
        loaded, _ = self.engine.load_checkpoint(
            str(path), tag=meta["tag"], load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if loaded is None:
            raise CheckpointError(f"{path}: DeepSpeed could not load checkpoint {meta['tag']}")
        return state

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name, "zero_stage": self.stage}

    def memory_split(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """This rank's bytes, a region of memory once (DeepSpeed's tensors are views of flat buffers). Parameters:
        the module's as held now (ZeRO-3: this rank's `ds_tensor` shards). Gradients: the module's .grad and the
        ZeRO optimizer's partitions (`averaged_gradients`, stage 1/2 `all_grad_tensors`, ZeRO-3's persistent
        `grad_partitions_flat_buffer`). Optimizer state: the float32 master partitions the wrapped SGD steps and
        its momentum on them (ZeRO's "K" bytes). Measured at 2 ranks: ZeRO-3 holds half of each."""
        assert self.engine is not None  # measured after attach, on a built engine
        zero = self.engine.optimizer
        params = [t for p in self.model.parameters() for t in (getattr(p, "ds_tensor", None), p.data) if t is not None]
        masters = _tensors(
            getattr(zero, "single_partition_of_fp32_groups", None), getattr(zero, "fp32_partitioned_groups_flat", None)
        )
        grads = [p.grad for p in [*self.model.parameters(), *masters] if p.grad is not None]
        held = ("averaged_gradients", "all_grad_tensors", "grads_in_partition", "grad_partitions_flat_buffer")
        grads += _tensors(*(getattr(zero, name, None) for name in held))
        states = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return {
            "parameters_bytes": _region_bytes(params),
            "gradients_bytes": _region_bytes(grads),
            "optimizer_states_bytes": _region_bytes([*masters, *states]),
        }


def _batchnorm_in_float32(model: nn.Module) -> None:
    """Every BatchNorm of `model` normalises with float32 weights and statistics under DeepSpeed's bf16/fp16, as
    under autocast (whose batch_norm runs in float32) and the lab's FSDP. DeepSpeed casts every parameter to
    the half dtype (ZeRO flattens each group in one dtype) and leaves buffers alone, and batch_norm refuses
    half weights beside float32 statistics; statistics cast to bf16 would average with 8 bits of mantissa.
    So each BatchNorm's forward lifts its weight and bias to float32 for the call (autograd casts their
    gradients back): batch_norm takes the half input beside float32 weights and statistics, returns half."""
    from torch.nn.modules.batchnorm import _BatchNorm

    for module in model.modules():
        if isinstance(module, _BatchNorm):
            # this module's forward replaced on purpose (an instance attribute shadowing the class's)
            module.forward = functools.partial(_float32_affine, module, type(module).forward)  # type: ignore[method-assign]


def _float32_affine(module: nn.Module, forward: Callable, inputs: torch.Tensor) -> torch.Tensor:
    """`forward(module, inputs)` with the module's weight and bias seen as float32 copies (ZeRO-3 has gathered
    them by now; they are put back before its post-forward hook re-partitions them)."""
    held = {k: p for k, p in module._parameters.items() if k in ("weight", "bias") and p is not None}
    # Plain tensors where torch declares Parameters, for this one call: autograd carries their gradients back
    cast("dict[str, torch.Tensor | None]", module._parameters).update({k: p.float() for k, p in held.items()})
    try:
        return forward(module, inputs)
    finally:
        module._parameters.update(held)


def _folder(path: Path) -> Path:
    return path.parent if path.name == POINTER else path


def _tensors(*items: Any) -> list[torch.Tensor]:
    """The tensors in `items`, which may be lists and dicts of them (DeepSpeed keeps one entry per group)."""
    inner = [v for i in items if isinstance(i, (dict, list, tuple)) for v in (i.values() if isinstance(i, dict) else i)]
    return [i for i in items if torch.is_tensor(i)] + (_tensors(*inner) if inner else [])


def _region_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of memory `tensors` cover, overlaps counted once (views of one flat buffer, a parameter and
    the shard it was gathered from are separate regions)."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors if t.numel())
    total, end = 0, 0
    for start, stop in spans:
        total += max(0, stop - max(start, end))
        end = max(end, stop)
    return total
