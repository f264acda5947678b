"""A rank's two loaders of a run: training batches as the step plan cuts them, and test batches that read each test
sample once across ranks."""

from __future__ import annotations

import torch

from lab.run import data
from lab.run.cluster.dist import DistContext
from lab.run.config import Config
from lab.run.training.plan import StepPlan


def for_training(
    cfg: Config, ctx: DistContext, dataset: data.Dataset, plan: StepPlan, dtype: torch.dtype
) -> data.DeviceLoader:
    """This rank's shard of the training set, in the plan's micro-batches (a short last one kept under join)."""
    return data.DeviceLoader(
        dataset.train_images,
        dataset.train_labels,
        world_size=ctx.world_size,
        rank=ctx.global_rank,
        batch_size=plan.batch_per_rank,
        seed=cfg.run.seed,
        shuffle=cfg.data.shuffle,
        uneven=cfg.data.uneven,
        augment=cfg.data.augment,
        dtype=dtype,
        channels_last=cfg.model.channels_last,
        keep_partial=plan.join,
    )


def for_evaluation(cfg: Config, ctx: DistContext, dataset: data.Dataset, dtype: torch.dtype) -> data.DeviceLoader:
    """Evaluation: each test sample exactly once across ranks, no padding to skew the accuracy."""
    return data.DeviceLoader(
        dataset.test_images,
        dataset.test_labels,
        world_size=ctx.world_size,
        rank=ctx.global_rank,
        batch_size=cfg.data.eval_batch_size_per_rank,
        seed=cfg.run.seed,
        shuffle=False,
        uneven="join",
        augment=False,
        dtype=dtype,
        channels_last=cfg.model.channels_last,
        keep_partial=True,
    )
