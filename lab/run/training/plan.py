"""The step plan: how a global batch and a training set become steps on each rank, before anything runs.

A pure function of the config, the world size and the training set's size, so every rank
knows every rank's step count without communicating, and the CLI can refuse a batch larger
than the data before torchrun starts a single process.

>>> from lab.run import config
>>> cfg = config.load("smoke", ["data.uneven=join"])           # 512 images, global batch 64, 2 epochs
>>> p = plan_steps(cfg, world_size=3, train_size=512)
Traceback (most recent call last):
lab.errors.ConfigError: ... train.global_batch_size: 64 is not divisible by world size 3 x ...
>>> p = plan_steps(config.with_overrides(cfg, train={"global_batch_size": 60}), world_size=3, train_size=512)
>>> p.batch_per_rank, p.steps_by_rank, p.steps_per_epoch, p.common_steps, p.total_steps
(20, (9, 9, 9), 9, 9, 18)
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.errors import ConfigError
from lab.run.config import Config, batch_size_per_rank
from lab.run.data.sharding import batch_count


@dataclass(frozen=True)
class StepPlan:
    world_size: int
    batch_per_rank: int  # samples in one micro-batch on one rank
    accumulation: int  # micro-batches per optimizer step
    steps_by_rank: tuple[int, ...]  # optimizer steps each rank takes per epoch (they differ under uneven=join)
    total_steps: int  # optimizer steps of the whole run, the schedule's length
    join: bool  # ranks with fewer steps wait in DDP's Join for the others

    @property
    def steps_per_epoch(self) -> int:
        """The epoch's length: the steps of the rank with the most (rank 0)."""
        return max(self.steps_by_rank)

    @property
    def common_steps(self) -> int:
        """Steps every rank takes in an epoch: collectives (logging, checkpoints) are safe up to here."""
        return min(self.steps_by_rank)

    def steps_of(self, rank: int) -> int:
        return self.steps_by_rank[rank]


def plan_steps(cfg: Config, world_size: int, train_size: int) -> StepPlan:
    """The plan for `cfg` on `world_size` ranks over `train_size` training samples; a ConfigError when a
    rank's share of the data holds no whole step."""
    t = cfg.train
    batch = batch_size_per_rank(cfg, world_size)
    join = cfg.data.uneven == "join" and world_size > 1
    steps_by_rank = tuple(
        batch_count(train_size, world_size, rank, cfg.data.uneven, batch, keep_partial=join) // t.grad_accum_steps
        for rank in range(world_size)
    )
    if min(steps_by_rank) < 1:
        raise ConfigError(
            f"{cfg.origin}: train.global_batch_size: {t.global_batch_size} is larger than a rank's share of the "
            f"training set ({train_size} samples over {world_size} ranks); use a smaller global batch or more data "
            f"(data.synthetic_train_size)"
        )
    total = t.epochs * max(steps_by_rank)
    if t.max_steps:
        total = min(total, t.max_steps)
    return StepPlan(world_size, batch, t.grad_accum_steps, steps_by_rank, total, join)
