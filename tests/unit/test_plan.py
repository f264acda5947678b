"""The step plan is a pure function that agrees with the loaders that cut the batches."""

from __future__ import annotations

import pytest
import torch

from lab.errors import ConfigError
from lab.run import config, data
from lab.run.training.plan import plan_steps

LAYOUTS = [
    (uneven, *layout)
    for uneven in ("pad", "drop", "join")
    for layout in [(1, 512, 1), (2, 515, 1), (3, 1001, 2), (4, 130, 1)]
    if not (uneven == "join" and layout[2] > 1)
]  # the config refuses join with accumulation


@pytest.mark.parametrize("uneven, world_size, train_size, accum", LAYOUTS)
def test_each_rank_takes_the_steps_its_loader_has_batches_for(uneven, world_size, train_size, accum):
    cfg = config.load(
        "smoke", [f"data.uneven={uneven}", "train.global_batch_size=24", f"train.grad_accum_steps={accum}"]
    )
    plan = plan_steps(cfg, world_size, train_size)
    labels = torch.arange(train_size)
    images = torch.zeros(train_size, 3, 32, 32, dtype=torch.uint8)
    for rank in range(world_size):
        loader = data.DeviceLoader(
            images,
            labels,
            world_size=world_size,
            rank=rank,
            batch_size=plan.batch_per_rank,
            seed=0,
            shuffle=True,
            uneven=uneven,
            augment=False,
            dtype=torch.float32,
            keep_partial=plan.join,
        )
        drawn = sum(1 for _ in loader.epoch(0))
        assert plan.steps_of(rank) == drawn // accum
    assert plan.batch_per_rank * world_size * accum == 24
    assert plan.common_steps <= plan.steps_per_epoch == plan.steps_of(0)
    assert plan.join == (uneven == "join" and world_size > 1)
    assert plan.total_steps == cfg.train.epochs * plan.steps_per_epoch


def test_max_steps_caps_the_run():
    cfg = config.load("smoke", ["train.max_steps=3"])
    assert plan_steps(cfg, 2, 512).total_steps == 3


def test_a_batch_larger_than_a_ranks_share_is_refused_with_what_would_work():
    cfg = config.load("smoke", ["train.global_batch_size=512"])
    with pytest.raises(
        ConfigError,
        match="512 is larger than a rank's share of the training set .300 samples "
        "over 2 ranks.; use a smaller global batch",
    ):
        plan_steps(cfg, 2, 300)
