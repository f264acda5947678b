"""Training numbers between log intervals, measured without making the host wait for the device.

Loss and accuracy sums stay on the device until the interval closes; closing reduces them
across ranks in one collective, the step loop's only host sync. Throughput leaves out a
process's first interval (allocator, cuDNN autotuning and compilation warm up there).

>>> import torch
>>> meter = IntervalMeter(torch.device("cpu"), start_step=0)
>>> meter.add(torch.tensor(2.0), torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([1, 1]))
>>> meter.rank_samples
2
>>> pace = Throughput()
>>> pace.add(100, 10.0); pace.add(300, 1.0); pace.add(300, 2.0)
>>> pace.samples_per_second                    # the warm-up interval (10 img/s) is left out
200.0
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from lab.run.cluster import dist


@dataclass(frozen=True)
class Interval:
    """One log interval, summed over every rank (rank_* fields: this rank alone)."""

    step: int  # optimizer steps done at its end
    steps: int  # optimizer steps it spans
    seconds: float
    samples: int  # over all ranks
    loss: float  # mean training loss of its samples
    accuracy: float
    rank_samples: int
    rank_waits: list[float] | None = None  # each rank's gradient-communication wait in its last sampled step

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds

    @property
    def rank_samples_per_second(self) -> float:
        return self.rank_samples / self.seconds


class IntervalMeter:
    def __init__(self, device: torch.device, start_step: int) -> None:
        self.device = device
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.rank_samples = 0  # known on the host without asking the device
        self.start_step = start_step
        self.start_time = time.perf_counter()

    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """One micro-batch's mean loss and predictions, added on the device."""
        self.loss_sum += loss.detach().to(torch.float64) * len(labels)
        self.correct += (logits.detach().argmax(dim=1) == labels).sum()
        self.rank_samples += len(labels)

    def restart_clock(self) -> None:
        """Time from now: what came before (an evaluation, a set-up) is not training."""
        self.start_time = time.perf_counter()

    def close(self, ctx: dist.DistContext, step: int, wait: float | None = None) -> Interval | None:
        """Reduce over ranks (every rank must call it at the same step), start the next interval, and return
        the one that ended; None when no step was taken since the last close. `wait`: this rank's gradient
        communication time (lab.run.training.stragglers); each rank's lands in its own slot of the same sum, so every
        rank learns all of them in the one collective."""
        if step == self.start_step:
            return None
        # torch.full is a fill on the device; torch.tensor(number, device=cuda) would be a blocking host copy
        samples_here = torch.full((), float(self.rank_samples), dtype=torch.float64, device=self.device)
        slots = torch.zeros(ctx.world_size if ctx.distributed else 0, dtype=torch.float64, device=self.device)
        if ctx.distributed and wait is not None:
            slots[ctx.global_rank] = wait  # a fill on the device
        totals = torch.cat([torch.stack([self.loss_sum, self.correct.to(torch.float64), samples_here]), slots])
        loss_sum, correct, samples, *waits = dist.all_reduce_sum(ctx, totals).tolist()
        now = time.perf_counter()
        interval = Interval(
            step=step,
            steps=step - self.start_step,
            seconds=now - self.start_time,
            samples=int(samples),
            loss=loss_sum / samples,
            accuracy=correct / samples,
            rank_samples=self.rank_samples,
            rank_waits=waits if waits and all(w > 0 for w in waits) else None,
        )
        self.loss_sum.zero_()
        self.correct.zero_()
        self.rank_samples = 0
        self.start_step, self.start_time = step, now
        return interval


class Throughput:
    """Samples per second over the intervals after a process's first (the first when it is the only one)."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None
        self.samples = self.seconds = 0.0
        self.intervals = 0

    def add(self, samples: float, seconds: float) -> None:
        if self.first is None:
            self.first = (samples, seconds)
            return
        self.samples += samples
        self.seconds += seconds
        self.intervals += 1

    @property
    def samples_per_second(self) -> float | None:
        if self.intervals:
            return self.samples / self.seconds
        return self.first[0] / self.first[1] if self.first else None
