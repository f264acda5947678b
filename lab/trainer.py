"""The Trainer: one code path for the single-device baseline and DDP under torchrun.

World size 1 is the baseline: no process group, no DDP wrapper, the same loop.
The step loop never reads a value back to the host; loss, accuracy and sample
counts accumulate on the device and are reduced across ranks once per
`train.log_every` steps, the loop's only host sync. A whole run around it
(run directory, resume, records, exporter) is lab.train.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from lab import checkpoint, compat, data, dist, model as models, torchrun_env
from lab.config import Config, batch_size_per_rank, to_dict
from lab.console import Console, SilentConsole
from lab.errors import ConfigError, LaunchError
from lab.runs import RunDir

Hook = Callable[[dict[str, Any]], None]


class Trainer:
    def __init__(self, cfg: Config, ctx: dist.DistContext, dataset: data.Dataset, *,
                 console: Console | None = None, hooks: Iterable[Hook] = (), run_dir: RunDir | None = None,
                 resume: tuple[dict, str] | None = None) -> None:
        self.cfg, self.ctx, self.run_dir = cfg, ctx, run_dir
        self.console = console or SilentConsole()
        self.hooks = list(hooks)
        t = cfg.train
        self.dtype = getattr(torch, cfg.model.dtype)

        torch.manual_seed(cfg.run.seed)  # one initialisation on every rank (DDP also broadcasts rank 0's)
        self.model = models.build(cfg.model).to(ctx.device)
        if cfg.model.sync_batchnorm:
            if ctx.device.type != "cuda":
                raise LaunchError(f"model.sync_batchnorm: SyncBatchNorm runs only on CUDA devices in PyTorch; this "
                                  f"run is on {ctx.device.type} ({ctx.backend or 'no process group'}); set "
                                  f"model.sync_batchnorm=false, or model.norm=group for batch-independent norms")
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)

        self.ddp = None
        if ctx.distributed:
            self.ddp = DDP(self.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                           bucket_cap_mb=cfg.dist.bucket_cap_mb, gradient_as_bucket_view=cfg.dist.gradient_as_bucket_view,
                           static_graph=cfg.dist.static_graph, **compat.ddp_buffer_sync(cfg.dist.broadcast_buffers))
        network = self.ddp or self.model
        self.forward = torch.compile(network) if cfg.model.compile else network

        # Data: every rank knows every rank's batch count, so the step counts need no communication.
        self.batch_size = batch_size_per_rank(cfg, ctx.world_size)
        self.join_mode = cfg.data.uneven == "join" and ctx.distributed
        self.train_loader = data.DeviceLoader(
            dataset.train_images, dataset.train_labels, world_size=ctx.world_size, rank=ctx.global_rank,
            batch_size=self.batch_size, seed=cfg.run.seed, shuffle=cfg.data.shuffle, uneven=cfg.data.uneven,
            augment=cfg.data.augment, dtype=self.dtype, channels_last=cfg.model.channels_last,
            keep_partial=self.join_mode)
        # Evaluation: each test sample exactly once across ranks, no padding to skew the accuracy.
        self.test_loader = data.DeviceLoader(
            dataset.test_images, dataset.test_labels, world_size=ctx.world_size, rank=ctx.global_rank,
            batch_size=cfg.data.eval_batch_size_per_rank, seed=cfg.run.seed, shuffle=False, uneven="join",
            augment=False, dtype=self.dtype, channels_last=cfg.model.channels_last, keep_partial=True)
        per_rank = [self.train_loader.batches_per_epoch(r) // t.grad_accum_steps for r in range(ctx.world_size)]
        self.my_steps_per_epoch = per_rank[ctx.global_rank]
        self.steps_per_epoch = max(per_rank)
        self.common_steps = min(per_rank)  # steps every rank takes: collectives are safe up to here
        if self.common_steps < 1:
            raise ConfigError(
                f"{cfg.origin}: train.global_batch_size: {t.global_batch_size} is larger than a rank's share of the "
                f"training set "
                f"({len(dataset.train_labels)} samples over {ctx.world_size} ranks); use a smaller global batch or "
                f"more data (data.synthetic_train_size)")
        self.total_steps = t.epochs * self.steps_per_epoch
        if t.max_steps:
            self.total_steps = min(self.total_steps, t.max_steps)

        self.optimizer = self._make_optimizer()
        self.scheduler = self._make_scheduler()
        self.amp_dtype = self._choose_amp()
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.amp_dtype == torch.float16)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=t.label_smoothing)

        self.step = 0            # optimizer steps done, the same on every rank
        self.epoch = 0
        self.step_in_epoch = 0
        self.stopped = False     # ended by train.stop_after_steps
        self.last_eval: dict[str, Any] | None = None
        if resume is not None:
            self._restore(*resume)

        # Device-side accumulators between log intervals (no host sync per step).
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self._correct = torch.zeros((), dtype=torch.int64, device=ctx.device)
        self._samples = 0  # known on the host without asking the device
        self._last_log_step = self.step
        self._last_log_time = time.perf_counter()
        self._timed = {"samples": 0.0, "seconds": 0.0, "intervals": 0, "first": None}
        self.last_row: dict[str, Any] | None = None
        self._profiler = None

    # ------------------------------------------------------------------------- set-up

    def _make_optimizer(self) -> torch.optim.Optimizer:
        t = self.cfg.train
        decay, no_decay = [], []
        for p in self.model.parameters():
            (decay if p.ndim > 1 else no_decay).append(p)  # norms and biases are 1-d: no weight decay
        groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        # fused kernels on CUDA; foreach (a few big kernels instead of one per tensor) elsewhere
        fast = {"fused": True} if self.ctx.device.type == "cuda" else {"foreach": True}
        return torch.optim.SGD(groups, lr=t.lr, momentum=t.momentum, nesterov=t.nesterov and t.momentum > 0, **fast)

    def _make_scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        t, total = self.cfg.train, self.total_steps
        if t.schedule == "onecycle":
            if total < 2:
                raise ConfigError(f"{self.cfg.origin}: train.schedule: onecycle needs at least 2 steps, this run has "
                                  f"{total}; use cosine or more steps")
            rising = min(max(t.warmup_steps or round(0.3 * total), 1), total - 1)  # 0.3 is OneCycleLR's default
            return torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=t.lr, total_steps=total,
                                                       pct_start=rising / total)
        warm = t.warmup_steps

        def factor(step: int) -> float:  # step = optimizer steps taken so far
            if step < warm:
                return (step + 1) / warm
            if t.schedule == "constant":
                return 1.0
            progress = min(1.0, (step - warm) / max(1, total - warm))
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)

    def _choose_amp(self) -> torch.dtype | None:
        want, device = self.cfg.train.amp, self.ctx.device
        if want == "off" or (want == "auto" and device.type != "cuda"):
            return None
        if self.dtype == torch.float64:
            self.console.say("train.amp: off, because model.dtype is float64")
            return None
        if device.type == "cuda":
            if want in ("auto", "bf16") and not torch.cuda.is_bf16_supported():
                self.console.say(f"train.amp: {torch.cuda.get_device_name(device)} has no bf16; running without AMP")
                return None
            return torch.float16 if want == "fp16" else torch.bfloat16
        if want == "fp16":
            self.console.say("train.amp: fp16 autocast is for GPUs; running the CPU without AMP")
            return None
        return torch.bfloat16  # CPU autocast supports bf16

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.ctx.device.type, dtype=self.amp_dtype)

    # ------------------------------------------------------------------------- checkpoints

    def compat(self) -> dict[str, Any]:
        """Facts a checkpoint must share with this run to be resumed exactly."""
        return {**models.signature(self.cfg.model), "global_batch_size": self.cfg.train.global_batch_size,
                "total_steps": self.total_steps, "train_size": len(self.train_loader.labels),
                "sync_batchnorm": self.cfg.model.sync_batchnorm}

    def state(self) -> dict[str, Any]:
        return {
            "compat": self.compat(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": {"step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch},
            "data": {"seed": self.cfg.run.seed, "shuffle": self.cfg.data.shuffle, "uneven": self.cfg.data.uneven},
            "rng": checkpoint.rng_state(self.ctx.device),
            "world_size": self.ctx.world_size,
            "config": to_dict(self.cfg),
        }

    def _restore(self, state: dict, path: str) -> None:
        # Every rank loads the same state, so loading after the DDP wrap keeps the ranks in step.
        checkpoint.check_matches(path, state, self.compat())
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        progress = state["progress"]
        self.step, self.epoch, self.step_in_epoch = progress["step"], progress["epoch"], progress["step_in_epoch"]
        checkpoint.set_rng_state(state["rng"], self.ctx.device)

    def save_checkpoint(self) -> None:
        if self.run_dir is not None and self.cfg.checkpoint.save and self.ctx.is_primary:
            checkpoint.save(self.run_dir.checkpoints / checkpoint.LAST, self.state())

    # ------------------------------------------------------------------------- the loop

    def fit(self) -> dict[str, Any]:
        """Train to `total_steps` (or `stop_after_steps`); returns the run's summary numbers."""
        self.model.train()
        self._last_log_time = time.perf_counter()
        with self._profiling() as self._profiler:
            while self.step < self.total_steps and not self.stopped:
                self._train_epoch()
        if not self.stopped:  # a stopped run saved its checkpoint where it stopped
            if self.last_eval is None or self.last_eval["step"] != self.step:
                self.evaluate()
            self.save_checkpoint()
        self.console.close()
        return self.results()

    def _profiling(self) -> contextlib.AbstractContextManager:
        """A torch.profiler over `train.profile_steps` steps after warm-up, or nothing."""
        steps = self.cfg.train.profile_steps
        if not steps or self.run_dir is None:
            return contextlib.nullcontext()
        from lab import profiling

        return profiling.profiler(steps, self.ctx, self.run_dir.path, self.console)

    def _train_epoch(self) -> None:
        t = self.cfg.train
        accum = t.grad_accum_steps
        batches = self.train_loader.epoch(self.epoch, start=self.step_in_epoch * accum)
        joining = Join([self.ddp]) if self.join_mode else contextlib.nullcontext()
        with joining:
            while self.step_in_epoch < self.my_steps_per_epoch and self.step < self.total_steps:
                for micro in range(accum):
                    inputs, labels = next(batches)
                    self.forward_backward(inputs, labels, sync=micro == accum - 1, scale=1.0 / accum)
                self.optimizer_step()
                self.step += 1
                self.step_in_epoch += 1
                self.console.advance()
                if self._profiler is not None:
                    self._profiler.step()
                last_of_epoch = self.step_in_epoch == self.steps_per_epoch or self.step == self.total_steps
                if self.step_in_epoch <= self.common_steps and not last_of_epoch:
                    self._sync_point()
                    if self.stopped:
                        return
        if self.join_mode:
            self._resync_after_join()
        epoch_done = self.step_in_epoch == self.steps_per_epoch
        self.flush_log()
        if epoch_done:
            self.evaluate()
            self.epoch += 1
            self.step_in_epoch = 0
        self._sync_point()

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor, sync: bool = True,
                         scale: float = 1.0) -> None:
        """One micro-batch: forward, loss, backward (gradients all-reduced when `sync`), device-side tallies."""
        # DDP all-reduces gradients during backward; skip it on all but the last micro-batch.
        skip_sync = self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()
        with skip_sync:
            with self._autocast():
                logits = self.forward(inputs)
                loss = self.criterion(logits, labels)
            self.scaler.scale(loss * scale).backward()
        self._loss_sum += loss.detach().to(torch.float64) * len(labels)
        self._correct += (logits.detach().argmax(dim=1) == labels).sum()
        self._samples += len(labels)

    def train_step(self, inputs: torch.Tensor, labels: torch.Tensor, sync: bool = True) -> None:
        """One optimizer step on one batch, no accumulation: what the benchmarks time.
        With sync=False the gradients stay local (DDP's no_sync), to time a step without communication."""
        self.forward_backward(inputs, labels, sync=sync)
        self.optimizer_step()
        self.step += 1

    def optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def _resync_after_join(self) -> None:
        """After uneven inputs, make every rank hold rank 0's state again.

        Rank 0 has the largest shard, so it took every step of the epoch; a rank that
        joined early missed its last optimizer step (momentum, schedule). DDP's Join
        re-syncs parameters only, so the rest is broadcast here."""
        missed = self.steps_per_epoch - self.my_steps_per_epoch
        for _ in range(min(missed, self.total_steps - self.step)):
            self.scheduler.step()
        self.step += min(missed, self.total_steps - self.step)
        self.step_in_epoch = min(self.steps_per_epoch, self.step_in_epoch + missed)
        momentum = [self.optimizer.state[p]["momentum_buffer"] for p in self.model.parameters()
                    if self.optimizer.state.get(p, {}).get("momentum_buffer") is not None]
        dist.broadcast_from_primary(self.ctx, [*self.model.parameters(), *self.model.buffers(), *momentum])

    def _sync_point(self) -> None:
        """Where all ranks are in step: log, checkpoint and stop here, never in a ragged tail."""
        t, c = self.cfg.train, self.cfg.checkpoint
        if self.step % t.log_every == 0:
            self.flush_log()
        if c.every_steps and self.step % c.every_steps == 0 and self.step < self.total_steps:
            self.save_checkpoint()
        if t.stop_after_steps and self.step >= t.stop_after_steps and self.step < self.total_steps:
            self.flush_log()
            self.save_checkpoint()
            self.stopped = True

    def flush_log(self) -> None:
        """Reduce the accumulators across ranks (one host sync) and hand a row to the hooks."""
        if self.step == self._last_log_step:
            return
        totals = torch.stack([self._loss_sum, self._correct.to(torch.float64),
                              torch.tensor(float(self._samples), dtype=torch.float64, device=self.ctx.device)])
        loss_sum, correct, samples = dist.all_reduce_sum(self.ctx, totals).tolist()
        now = time.perf_counter()
        seconds = now - self._last_log_time
        steps = self.step - self._last_log_step
        allocated, peak = dist.memory_bytes(self.ctx.device)
        row = {
            "kind": "train", "step": self.step, "epoch": self.epoch, "total_steps": self.total_steps,
            "loss": loss_sum / samples, "accuracy": correct / samples, "lr": self.optimizer.param_groups[0]["lr"],
            "samples_per_second": samples / seconds, "step_time_seconds": seconds / steps,
            "rank_samples": self._samples, "rank_samples_per_second": self._samples / seconds,
            "device_memory_allocated_bytes": allocated, "device_memory_peak_bytes": peak,
            "world_size": self.ctx.world_size, "attempt": torchrun_env.restart_count(), "time": time.time(),
        }
        self._count_throughput(samples, seconds)
        self._loss_sum.zero_()
        self._correct.zero_()
        self._samples = 0
        self._last_log_step, self._last_log_time = self.step, now
        self.last_row = row
        self._emit(row)

    def _count_throughput(self, samples: float, seconds: float) -> None:
        # The first interval of a process includes warm-up (allocator, cuDNN autotune, compilation):
        # the summary's throughput leaves it out whenever a later interval exists.
        timed = self._timed
        if timed["first"] is None:
            timed["first"] = (samples, seconds)
            return
        timed["samples"] += samples
        timed["seconds"] += seconds
        timed["intervals"] += 1

    def throughput(self) -> float | None:
        timed = self._timed
        if timed["intervals"]:
            return timed["samples"] / timed["seconds"]
        return timed["first"][0] / timed["first"][1] if timed["first"] else None

    def _emit(self, row: dict[str, Any]) -> None:
        for hook in self.hooks:
            hook(row)

    # ------------------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Test loss and accuracy of rank 0's model, each test sample counted once across ranks."""
        dist.broadcast_from_primary(self.ctx, list(self.model.buffers()))  # BatchNorm statistics differ per rank
        self.model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
        for inputs, labels in self.test_loader.epoch(0):
            with self._autocast():
                logits = self.model(inputs)
            totals[0] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").to(torch.float64)
            totals[1] += (logits.argmax(dim=1) == labels).sum()
            totals[2] += len(labels)
        loss_sum, correct, count = dist.all_reduce_sum(self.ctx, totals).tolist()
        self.model.train()
        self._last_log_time = time.perf_counter()  # the next log interval times training, not evaluation
        row = {"kind": "eval", "step": self.step, "epoch": self.epoch, "test_loss": loss_sum / count,
               "test_accuracy": correct / count, "test_samples": int(count), "time": time.time()}
        self.last_eval = row
        self._emit(row)
        return row

    def results(self) -> dict[str, Any]:
        sps = self.throughput()
        _, peak = dist.memory_bytes(self.ctx.device)
        return {
            "steps": self.step, "total_steps": self.total_steps, "epochs_completed": self.epoch,
            "final_loss": self.last_row["loss"] if self.last_row else None,
            "test_loss": self.last_eval["test_loss"] if self.last_eval else None,
            "test_accuracy": self.last_eval["test_accuracy"] if self.last_eval else None,
            "samples_per_second": sps,
            "samples_per_second_per_rank": sps / self.ctx.world_size if sps else None,
            "device_memory_peak_bytes": peak,
        }


def set_determinism(deterministic: bool) -> None:
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True  # fixed input shapes: autotuned convolutions pay off
