"""The Lightning side of `lab bench lightning` (lab.measure.bench.train.lightning_peer): one torchrun worker of the job
the
parent starts (lab.run.cluster.jobs), training the lab's model, data, optimizer and precision with Lightning's Trainer
as a Lightning user would, and timing its steady state the way the lab side is timed; global rank 0 reports.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # imported where used: the lab imports without Lightning, `lab bench --help` without torch
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.utilities.types import STEP_OUTPUT, OptimizerLRSchedulerConfig
    from torch import nn

    from lab.run.cluster.torchrun_env import Layout
    from lab.run.config import Config
    from lab.run.data import DeviceLoader


def worker(argv: list[str]) -> None:
    from lab.run.cluster import jobs

    job = jobs.this_job(argv)
    assert job.config is not None  # the parent (lab.measure.bench.train.lightning_peer) hands its checked config down
    result = train_with_lightning(
        job.config, job.params["steps"], job.params["warmup"], job.params["lightning_ddp"], job.folder
    )
    if result is not None:
        job.report(0, result)


def train_with_lightning(cfg: Config, steps: int, warmup: int, ddp_settings: str, root: Path) -> dict[str, Any] | None:
    """Train `cfg` for `steps` steps under Lightning; the result on global rank 0, None on the others."""
    import warnings

    import lightning  # in the functions only: the lab imports without it
    import torch

    # Lightning 2.6.6 calls a torch pytree API that newer torch deprecates: one line per rank, nothing to act on.
    warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated")

    from lab.run import data
    from lab.run.cluster import cores, dist, torchrun_env
    from lab.run.training import model as models
    from lab.run.training import optim
    from lab.run.training.plan import plan_steps

    layout = torchrun_env.layout()
    device = dist.choose_device(cfg.dist.device, layout.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cores.threads_per_process(layout.local_world_size))  # as lab.run.cluster.dist does
    dtype = getattr(torch, cfg.model.dtype)
    amp = optim.choose_amp(cfg.train.amp, dtype, device, say=lambda _: None)  # the lab side says it
    torch.manual_seed(cfg.run.seed)  # the lab's initialisation: the same weights on both sides
    net = models.build(cfg.model)
    dataset = data.load(cfg.data).to(device)
    plan = plan_steps(cfg, layout.world_size, len(dataset.train_labels))
    loader = data.DeviceLoader(
        dataset.train_images,
        dataset.train_labels,
        world_size=layout.world_size,
        rank=layout.global_rank,
        batch_size=plan.batch_per_rank,
        seed=cfg.run.seed,
        shuffle=cfg.data.shuffle,
        uneven=cfg.data.uneven,
        augment=cfg.data.augment,
        dtype=dtype,
        channels_last=cfg.model.channels_last,
        keep_partial=plan.join,
    )
    clock, timing = _clock(device, warmup, steps)
    trainer = lightning.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=layout.local_world_size,
        num_nodes=layout.world_size // layout.local_world_size,
        strategy=_strategy(cfg, layout, ddp_settings),
        precision=precision(amp, dtype),
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        deterministic=cfg.run.deterministic,
        benchmark=not cfg.run.deterministic,  # as lab.run.training.trainer.set_determinism
        sync_batchnorm=cfg.model.sync_batchnorm and layout.world_size > 1,
        use_distributed_sampler=False,
        callbacks=[clock],
        default_root_dir=str(root),
    )
    trainer.fit(_module(net, cfg, steps), train_dataloaders=_Forever(loader))
    measured = timing(cfg.train.global_batch_size)  # every rank: it may reduce over them
    _leave_process_group()
    if layout.global_rank != 0:
        return None
    return {
        **measured,
        "precision": precision(amp, dtype),
        "world_size": layout.world_size,
        "batch_size_per_rank": plan.batch_per_rank,
        "threads": torch.get_num_threads(),
        "device": _device_name(device),
        "strategy": type(trainer.strategy).__name__,
        "lightning_version": lightning.__version__,
        "torch_version": torch.__version__,
        "data": dataset.description.split(" (")[0],
        "model": {
            "arch": cfg.model.arch,
            "width": cfg.model.width,
            "norm": cfg.model.norm,
            "dtype": cfg.model.dtype,
            "channels_last": cfg.model.channels_last,
            "compile": cfg.model.compile,
            "augment": cfg.data.augment,
        },
        "optimizer": {
            "name": "SGD",
            "lr": cfg.train.lr,
            "momentum": cfg.train.momentum,
            "nesterov": cfg.train.nesterov,
            "weight_decay": cfg.train.weight_decay,
            "schedule": cfg.train.schedule,
            "warmup_steps": cfg.train.warmup_steps,
        },
    }


def _leave_process_group() -> None:
    """Meet at a barrier, then destroy the group Lightning formed: Lightning leaves it for the interpreter's
    exit, where gloo's threads can still hold a finished collective's tensors. Seen in CI: rank 1 aborted
    with "terminate called without an active exception" after `max_steps` was reached. The why of the
    barrier is in lab.run.cluster.dist.initialized, which ends the lab's own runs the same way."""
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.barrier()
        tdist.destroy_process_group()


def precision(amp: torch.dtype | None, dtype: torch.dtype) -> Literal["bf16-mixed", "16-mixed", "64-true", "32-true"]:
    """Lightning's name for the lab's resolved precision.

    >>> import torch
    >>> precision(torch.bfloat16, torch.float32), precision(None, torch.float32), precision(None, torch.float64)
    ('bf16-mixed', '32-true', '64-true')
    """
    import torch

    if amp is not None:
        return "bf16-mixed" if amp == torch.bfloat16 else "16-mixed"
    return "64-true" if dtype == torch.float64 else "32-true"


def _strategy(cfg: Config, layout: Layout, ddp_settings: str) -> str | DDPStrategy:
    """One process: Lightning's own choice (one device, no DDP, as the lab's world size 1). More: DDP on the
    lab's backend and timeout, with the lab's DDP settings unless `ddp_settings` is "default"."""
    if layout.world_size == 1:
        return "auto"
    import datetime

    import lightning

    from lab import compat

    d = cfg.dist
    knobs: dict[str, Any] = (  # DDP's keyword arguments, of several types
        {}
        if ddp_settings == "default"
        else {
            "bucket_cap_mb": d.bucket_cap_mb,
            "gradient_as_bucket_view": d.gradient_as_bucket_view,
            "static_graph": d.static_graph,
            **compat.ddp_buffer_sync(d.broadcast_buffers),
        }
    )
    return lightning.pytorch.strategies.DDPStrategy(
        process_group_backend=None if d.backend == "auto" else d.backend,
        timeout=datetime.timedelta(seconds=d.timeout_seconds),
        **knobs,
    )


class _Forever:
    """The lab's device loader as Lightning's training data: batches without end, `max_steps` stops them.
    (Not a DataLoader, so Lightning adds no sampler: the loader shards by rank itself.)"""

    def __init__(self, loader: DeviceLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.loader.forever()


def _module(net: nn.Module, cfg: Config, total_steps: int) -> pl.LightningModule:
    """A LightningModule around the lab's model, loss, optimizer and schedule."""
    import lightning
    import torch
    from torch import nn

    from lab.run.training import optim

    class LabResNet(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.forward_net = torch.compile(net) if cfg.model.compile else net
            self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            inputs, labels = batch
            return self.criterion(self.forward_net(inputs), labels)

        def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
            optimizer = optim.build_optimizer(self.net, cfg.train, self.device)
            schedule = optim.build_schedule(optimizer, cfg.train, total_steps, cfg.origin)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    return LabResNet()


def _clock(device: torch.device, warmup: int, steps: int) -> tuple[pl.Callback, Callable[[int], dict[str, Any]]]:
    """A callback timing steps warmup+1..steps, the device finished at both ends (CUDA runs asynchronously), and
    its result for a global batch; losses are summed on the device, read once at the end, so the loop never waits
    for them."""
    import time

    import lightning
    import torch

    class Clock(lightning.Callback):
        def __init__(self) -> None:
            self.losses = torch.zeros(2, dtype=torch.float64, device=device)  # warm-up, timed
            self.started: float | None = None  # the clock after the warm-up's last step
            self.stopped: float | None = None  # and after the last

        def on_train_batch_end(
            self,
            trainer: pl.Trainer,
            module: pl.LightningModule,
            outputs: STEP_OUTPUT,
            batch: tuple[torch.Tensor, torch.Tensor],
            batch_idx: int,
        ) -> None:
            assert isinstance(outputs, Mapping)  # Lightning hands training_step's loss back as {"loss": loss}
            step = trainer.global_step  # optimizer steps done, this one included
            self.losses[0 if step <= warmup else 1] += outputs["loss"].detach().to(torch.float64)
            if step == warmup:
                self.started = self._now()
            elif step == steps:
                self.stopped = self._now()

        def _now(self) -> float:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter()

        def result(self, global_batch: int) -> dict[str, Any]:
            losses = self.losses
            if torch.distributed.is_initialized():  # the mean over ranks, as the lab's log rows
                torch.distributed.all_reduce(losses)
                losses = losses / torch.distributed.get_world_size()
            warm, timed = losses.tolist()
            assert self.started is not None and self.stopped is not None  # fit ran every step
            seconds = self.stopped - self.started
            return {
                "images_per_second": global_batch * (steps - warmup) / seconds,
                "seconds": seconds,
                "warmup_loss": warm / warmup,
                "timed_loss": timed / (steps - warmup),
            }

    clock = Clock()
    return clock, clock.result


def _device_name(device: torch.device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


if __name__ == "__main__":
    worker(sys.argv[1:])
