"""The Trainer: one code path for the single-device baseline and every strategy under torchrun (DDP, FSDP,
DeepSpeed: whichever row of lab.run.config.strategies dist.strategy names).

World size 1 is the baseline: no process group, no wrapper, the same loop; the strategy owns what differs. The pieces
it is built from each live in their own module: the step plan (lab.run.training.plan), the rank's training and test
loaders (lab.run.training.loaders), the optimizer, schedule and precision (lab.run.training.optim), how the model is
wrapped and stepped across ranks (lab.run.training.strategies), and the interval meter (lab.run.training.meter). The
step loop never reads a value back to the host; loss, accuracy and sample counts accumulate on the device and are
reduced across ranks once per `train.log_every` steps, the loop's only host sync. A whole
run around it (run directory, resume, records, exporter) is lab.run.training.lifecycle.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lab.run import data
from lab.run.cluster import dist, torchrun_env
from lab.run.config import Config, host_sync_warning, to_dict
from lab.run.observability import device_memory
from lab.run.training import checkpoint, loaders, optim, stragglers, strategies
from lab.run.training import model as models
from lab.run.training.console import Console, SilentConsole
from lab.run.training.meter import IntervalMeter, Throughput
from lab.run.training.plan import plan_steps
from lab.run.training.runs import RunDir

Hook = Callable[[dict[str, Any]], None]


class Trainer:
    def __init__(
        self,
        cfg: Config,
        ctx: dist.DistContext,
        dataset: data.Dataset,
        *,
        console: Console | None = None,
        hooks: Iterable[Hook] = (),
        run_dir: RunDir | None = None,
    ) -> None:
        self.cfg, self.ctx, self.run_dir = cfg, ctx, run_dir
        self.console = console or SilentConsole()
        self.hooks = list(hooks)
        t = cfg.train
        self.dtype = getattr(torch, cfg.model.dtype)

        self.amp_dtype = optim.choose_amp(t.amp, self.dtype, ctx.device, say=self.console.say)
        if warning := host_sync_warning(cfg, ctx.device):  # "never waits" does not hold here: say so
            self.console.say(warning)
        torch.manual_seed(cfg.run.seed)  # one initialisation on every rank (DDP also broadcasts rank 0's)
        self.strategy = strategies.build(cfg, ctx, models.build(cfg.model).to(ctx.device), self.amp_dtype)
        self.model = self.strategy.model

        # Every rank knows every rank's step count, so no step needs communication to be planned.
        self.plan = plan_steps(cfg, ctx.world_size, len(dataset.train_labels))
        self.train_loader = loaders.for_training(cfg, ctx, dataset, self.plan, self.dtype)
        self.test_loader = loaders.for_evaluation(cfg, ctx, dataset, self.dtype)

        self.optimizer = optim.build_optimizer(self.model, t, ctx.device)
        self.scheduler = optim.build_schedule(self.optimizer, t, self.total_steps, cfg.origin)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.amp_dtype == torch.float16)
        self.strategy.observe(run_dir.path if run_dir is not None else None)
        self.strategy.attach(self.optimizer, self.scheduler)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=t.label_smoothing)

        self.step = 0  # optimizer steps done, the same on every rank
        self.epoch = 0
        self.step_in_epoch = 0
        self.stopped = False  # ended by train.stop_after_steps
        self.last_eval: dict[str, Any] | None = None
        self.meter = IntervalMeter(ctx.device, self.step)
        self.slowest_ranks = stragglers.Tally()
        self.pace = Throughput()
        self.last_row: dict[str, Any] | None = None
        self._profiler = None

    @property
    def batch_size(self) -> int:
        """Samples in one micro-batch on this rank."""
        return self.plan.batch_per_rank

    @property
    def total_steps(self) -> int:
        return self.plan.total_steps

    @property
    def steps_per_epoch(self) -> int:
        return self.plan.steps_per_epoch

    def _autocast(self) -> contextlib.AbstractContextManager:
        return self.strategy.autocast(self.amp_dtype)

    # ------------------------------------------------------------------------- checkpoints

    def resume_signature(self) -> dict[str, Any]:
        """Facts a checkpoint must share with this run to be resumed exactly."""
        return {
            **models.signature(self.cfg.model),
            "global_batch_size": self.cfg.train.global_batch_size,
            "total_steps": self.total_steps,
            "train_size": len(self.train_loader.labels),
            "sync_batchnorm": self.cfg.model.sync_batchnorm,
        }

    def state(self) -> dict[str, Any]:
        """The trainer's part of a checkpoint; the strategy adds the model's and the optimizer's."""
        return {
            "compat": self.resume_signature(),  # the key older checkpoints have
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": {"step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch},
            "data": {"seed": self.cfg.run.seed, "shuffle": self.cfg.data.shuffle, "uneven": self.cfg.data.uneven},
            "rng": checkpoint.rng_state(self.ctx.device),
            "world_size": self.ctx.world_size,
            "strategy": self.strategy.name,
            "config": to_dict(self.cfg),
        }

    def checkpoint_folder(self) -> Path | None:
        """The folder of this run's checkpoints: <checkpoint.dir>/<run id>/, or the run directory's checkpoints/."""
        if self.run_dir is None:
            return None
        return checkpoint.run_folder(self.cfg.checkpoint.dir, self.run_dir.run_id, self.run_dir.checkpoints)

    def checkpoint_path(self) -> Path | None:
        """Where this run's checkpoint is saved (and resumed from with checkpoint.resume=auto)."""
        folder = self.checkpoint_folder()
        return None if folder is None else self.strategy.checkpoint_path(folder)

    def restore(self, path: str | Path) -> None:
        """Continue from a checkpoint: model, optimizer, schedule, progress and RNG, as they were saved."""
        signature = self.resume_signature()
        state = self.strategy.load(
            Path(path), self.optimizer, check=lambda state: checkpoint.check_matches(path, state, signature)
        )
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        progress = state["progress"]
        self.step, self.epoch, self.step_in_epoch = progress["step"], progress["epoch"], progress["step_in_epoch"]
        checkpoint.set_rng_state(state["rng"], self.ctx.device)
        self.meter = IntervalMeter(self.ctx.device, self.step)  # the first interval starts at the resumed step

    def save_checkpoint(self) -> None:
        if self.run_dir is not None and self.cfg.checkpoint.save:
            path = self.checkpoint_path()
            assert path is not None  # a run directory always has a checkpoint folder
            self.strategy.save(path, self.optimizer, self.state())

    # ------------------------------------------------------------------------- the loop

    def fit(self) -> dict[str, Any]:
        """Train to `total_steps` (or `stop_after_steps`); returns the run's summary numbers."""
        self.model.train()
        self.meter.restart_clock()
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
        from lab.run.observability import profiling

        return profiling.profiler(steps, self.ctx, self.run_dir.path, self.console)

    def _train_epoch(self) -> None:
        accum = self.cfg.train.grad_accum_steps
        my_steps = self.plan.steps_of(self.ctx.global_rank)
        batches = self.train_loader.epoch(self.epoch, start=self.step_in_epoch * accum)
        with self.strategy.uneven_inputs(self.plan.join):
            while self.step_in_epoch < my_steps and self.step < self.total_steps:
                self.accumulated_step(batches, accum)
                self.step_in_epoch += 1
                self.console.advance()
                if self._profiler is not None:
                    self._profiler.step()
                last_of_epoch = self.step_in_epoch == self.steps_per_epoch or self.step == self.total_steps
                if self.step_in_epoch <= self.plan.common_steps and not last_of_epoch:
                    self._log_save_or_stop()
                    if self.stopped:
                        return
        if self.plan.join:
            self._resync_after_join()
        epoch_done = self.step_in_epoch == self.steps_per_epoch
        self.flush_log()
        if epoch_done:
            self.evaluate()
            self.epoch += 1
            self.step_in_epoch = 0
        self._log_save_or_stop()

    def forward_backward(
        self, inputs: torch.Tensor, labels: torch.Tensor, sync: bool = True, scale: float = 1.0
    ) -> None:
        """One micro-batch: forward, loss, backward (gradients communicated when `sync`), device-side tallies."""
        with self.strategy.accumulating(sync):
            with self._autocast():
                logits = self.strategy.forward(inputs)
                loss = self.criterion(logits, labels)
            self.strategy.backward(loss * scale, self.scaler)
        self.meter.add(loss, logits, labels)

    def accumulated_step(
        self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], accum: int, sync: bool = True
    ) -> None:
        """One optimizer step from the next `accum` micro-batches of `batches` (drawn one at a time), each loss
        scaled 1/accum; gradients are communicated with the last one only. With sync=False they stay local
        (DDP's no_sync), to time a step without communication."""
        for micro in range(accum):
            inputs, labels = next(batches)
            self.forward_backward(inputs, labels, sync=sync and micro == accum - 1, scale=1.0 / accum)
        self.optimizer_step()
        self.step += 1

    def train_step(self, inputs: torch.Tensor, labels: torch.Tensor, sync: bool = True) -> None:
        """One optimizer step on one batch, no accumulation: what the benchmarks time."""
        self.accumulated_step(iter([(inputs, labels)]), 1, sync)

    def optimizer_step(self) -> None:
        self.strategy.step(self.optimizer, self.scheduler, self.scaler)

    def _resync_after_join(self) -> None:
        """After uneven inputs, make every rank hold rank 0's state again.

        Rank 0 has the largest shard, so it took every step of the epoch; a rank that
        joined early missed its last optimizer step (momentum, schedule). DDP's Join
        re-syncs parameters only, so the rest is broadcast here."""
        missed = min(self.steps_per_epoch - self.plan.steps_of(self.ctx.global_rank), self.total_steps - self.step)
        for _ in range(missed):
            self.scheduler.step()
        self.step += missed
        self.step_in_epoch = min(self.steps_per_epoch, self.step_in_epoch + missed)
        momentum = [
            self.optimizer.state[p]["momentum_buffer"]
            for p in self.model.parameters()
            if self.optimizer.state.get(p, {}).get("momentum_buffer") is not None
        ]
        dist.broadcast_from_primary(self.ctx, [*self.model.parameters(), *self.model.buffers(), *momentum])

    def _log_save_or_stop(self) -> None:
        """Log, checkpoint and stop when due. Called only where all ranks are in step, never in a ragged tail."""
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
        """Close the meter's interval (one host sync, a collective) and hand a row to the hooks."""
        interval = self.meter.close(self.ctx, self.step, self.strategy.communication_wait())
        if interval is None:
            return
        slowest = stragglers.straggler(interval.rank_waits or [], interval.seconds / interval.steps)
        self.slowest_ranks.add(slowest)
        allocated, peak = device_memory.memory_bytes(self.ctx.device)
        row = {
            "kind": "train",
            "step": self.step,
            "epoch": self.epoch,
            "total_steps": self.total_steps,
            "loss": interval.loss,
            "accuracy": interval.accuracy,
            "lr": self.optimizer.param_groups[0]["lr"],
            "samples_per_second": interval.samples_per_second,
            "step_time_seconds": interval.seconds / interval.steps,
            "rank_samples": interval.rank_samples,
            "rank_samples_per_second": interval.rank_samples_per_second,
            "device_memory_allocated_bytes": allocated,
            "device_memory_peak_bytes": peak,
            "world_size": self.ctx.world_size,
            "attempt": torchrun_env.restart_count(),
            "time": time.time(),
        }
        if slowest is not None:  # who the others waited for (lab.run.training.stragglers)
            row |= {"rank_wait_seconds": interval.rank_waits, "slowest_rank": slowest["rank"]}
            row |= {"slowest_rank_lag_seconds": slowest["lag_seconds"], "slowest_rank_share": slowest["share"]}
        self.pace.add(interval.samples, interval.seconds)
        self.last_row = row
        self._emit(row)

    def throughput(self) -> float | None:
        return self.pace.samples_per_second

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
        for inputs, labels in self._evaluation_batches():
            with self._autocast():
                logits = self.model(inputs)
            if labels is None:
                continue
            totals[0] += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").to(torch.float64)
            totals[1] += (logits.argmax(dim=1) == labels).sum()
            totals[2] += len(labels)
        loss_sum, correct, count = dist.all_reduce_sum(self.ctx, totals).tolist()
        self.model.train()
        self.meter.restart_clock()  # the next log interval times training, not evaluation
        row = {
            "kind": "eval",
            "step": self.step,
            "epoch": self.epoch,
            "test_loss": loss_sum / count,
            "test_accuracy": correct / count,
            "test_samples": int(count),
            "time": time.time(),
        }
        self.last_eval = row
        self._emit(row)
        return row

    def _evaluation_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """This rank's test batches; when a forward pass communicates (sharded parameters), then forwards of one
        blank image, uncounted, until every rank has run as many as the rank with the most test batches."""
        yield from self.test_loader.epoch(0)
        if self.strategy.forward_is_collective:
            most = max(self.test_loader.batches_per_epoch(r) for r in range(self.ctx.world_size))
            blank = torch.zeros(1, 3, 32, 32, dtype=self.dtype, device=self.ctx.device)
            if self.cfg.model.channels_last:
                blank = blank.to(memory_format=torch.channels_last)
            for _ in range(most - self.test_loader.batches_per_epoch()):
                yield blank, None

    def results(self) -> dict[str, Any]:
        sps = self.throughput()
        _, peak = device_memory.memory_bytes(self.ctx.device)
        return {
            "steps": self.step,
            "total_steps": self.total_steps,
            "epochs_completed": self.epoch,
            "final_loss": self.last_row["loss"] if self.last_row else None,
            "test_loss": self.last_eval["test_loss"] if self.last_eval else None,
            "test_accuracy": self.last_eval["test_accuracy"] if self.last_eval else None,
            "samples_per_second": sps,
            "samples_per_second_per_rank": sps / self.ctx.world_size if sps else None,
            "device_memory_peak_bytes": peak,
            "slowest_rank": self.slowest_ranks.summary(),
        }


def set_determinism(deterministic: bool) -> None:
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True  # fixed input shapes: autotuned convolutions pay off
