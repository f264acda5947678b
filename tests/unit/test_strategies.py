"""The strategy seam, DDP's side of it at world size 1 (the baseline); under torchrun the distributed
tests train through it (test_equivalence, test_accumulation, test_ddp_training)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from lab.errors import CheckpointError, LaunchError
from lab.run import config
from lab.run.cluster.dist import DistContext
from lab.run.training import checkpoint, strategies
from lab.run.training import model as models

CPU = torch.device("cpu")


def _ctx(rank: int = 0) -> DistContext:
    return DistContext(rank, rank, 1, 1, 0, CPU, None)


def _strategy(overrides: tuple[str, ...] = (), rank: int = 0) -> Any:  # the strategy `build` picks, its own type
    cfg = config.load("smoke", ["model.width=8", *overrides])
    return strategies.build(cfg, _ctx(rank), models.build(cfg.model))


def test_the_baseline_is_ddps_code_path_without_the_wrapper():
    s = _strategy()
    assert s.name == "ddp" and s.ddp is None and s.forward is s.model
    assert isinstance(s.accumulating(sync=False), contextlib.nullcontext)
    assert isinstance(s.uneven_inputs(enabled=True), contextlib.nullcontext)
    assert s.describe() == {"strategy": "ddp"}


def _optimizer_and_schedule(s: strategies.Strategy):
    opt = torch.optim.SGD(s.model.parameters(), lr=0.1, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))


def test_a_step_through_the_strategy_changes_the_weights_the_rate_and_clears_the_gradients():
    s = _strategy()
    opt, schedule = _optimizer_and_schedule(s)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    before = [p.detach().clone() for p in s.model.parameters()]
    with s.accumulating(sync=True):
        loss = s.forward(torch.randn(4, 3, 32, 32)).logsumexp(dim=1).mean()
        s.backward(loss, scaler)
    s.step(opt, schedule, scaler)
    assert any(not torch.equal(a, p) for a, p in zip(before, s.model.parameters()))
    assert all(p.grad is None for p in s.model.parameters())
    assert opt.param_groups[0]["lr"] == 0.05  # the schedule took its step too


def _trained(s: strategies.Strategy):
    opt, schedule = _optimizer_and_schedule(s)
    s.forward(torch.randn(4, 3, 32, 32)).mean().backward()
    s.step(opt, schedule, torch.amp.GradScaler("cpu", enabled=False))
    return opt


def test_a_checkpoint_restores_model_and_optimizer_and_hands_back_the_trainers_part(tmp_path):
    s = _strategy()
    opt = _trained(s)
    path = s.checkpoint_path(tmp_path)
    s.save(path, opt, {"progress": {"step": 1}})
    saved = checkpoint.load(path)
    assert not any(k.startswith("module.") for k in saved["model"])  # loads into a model without DDP

    other = _strategy(["run.seed=7"])
    other_opt, _ = _optimizer_and_schedule(other)
    seen = []
    state = other.load(path, other_opt, check=seen.append)
    assert seen and seen[0]["progress"] == {"step": 1} and state["progress"] == {"step": 1}
    assert all(torch.equal(v, other.model.state_dict()[k]) for k, v in s.model.state_dict().items())
    assert torch.equal(
        other_opt.state_dict()["state"][0]["momentum_buffer"], opt.state_dict()["state"][0]["momentum_buffer"]
    )


def test_a_refused_checkpoint_loads_nothing(tmp_path):
    s = _strategy()
    path = s.checkpoint_path(tmp_path)
    s.save(path, _trained(s), {})
    other = _strategy(["run.seed=7"])
    before = {k: v.clone() for k, v in other.model.state_dict().items()}

    def refuse(state):
        raise CheckpointError("does not fit this run")

    with pytest.raises(CheckpointError):
        other.load(path, _optimizer_and_schedule(other)[0], check=refuse)
    assert all(torch.equal(v, other.model.state_dict()[k]) for k, v in before.items())


def test_only_global_rank_0_writes_the_checkpoint(tmp_path):
    s = _strategy(rank=1)
    s.save(tmp_path / "rank1.pt", _trained(s), {"x": torch.ones(1)})
    s = _strategy(rank=0)
    s.save(tmp_path / "rank0.pt", _trained(s), {"x": torch.ones(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.pt"]
    assert torch.equal(checkpoint.load(tmp_path / "rank0.pt")["x"], torch.ones(1))


def test_syncbatchnorm_on_the_cpu_is_refused_in_one_line():
    with pytest.raises(LaunchError, match="SyncBatchNorm runs only on CUDA devices"):
        _strategy(["model.sync_batchnorm=true"])
