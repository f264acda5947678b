"""No host sync inside the step loop except at log intervals (and evaluation, and checkpoints).

Every call that makes the host wait for the device (.item, .tolist, .cpu, .numpy, and
Python's bool/float/int of a tensor) is counted while real training steps run, and
attributed to where it happened. So is every tensor built from host data by the lab's own
code (torch.tensor, torch.as_tensor, torch.asarray, torch.from_numpy): on CUDA each is a
blocking host-to-device copy when it lands on the device, which no CPU sync counter sees.
On a GPU the same rule is enforced by torch.cuda.set_sync_debug_mode("error") in
`lab gpu-check`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import pytest
import torch

import lab
from lab.run import config, data
from lab.run.cluster import dist
from lab.run.training.trainer import Trainer

SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
FROM_HOST = ("tensor", "as_tensor", "asarray", "from_numpy")
ALLOWED = ("flush_log", "evaluate", "save_checkpoint")
LAB_DIR = str(Path(lab.__file__).parent)


class SyncCounter:
    def __init__(self) -> None:
        self.inside_allowed = 0
        self.allowed_calls = 0
        self.violations: list[str] = []

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        for name in SYNCING:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, original))
        for name in FROM_HOST:
            monkeypatch.setattr(torch, name, self._wrap_creation(name, getattr(torch, name)))
        for name in ALLOWED:
            original = getattr(Trainer, name)
            monkeypatch.setattr(Trainer, name, self._allow(original))
        yield self

    def _wrap_creation(self, name, original):
        @functools.wraps(original)
        def counted(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(LAB_DIR) and not self.inside_allowed:  # torch's own internals are not ours
                self.violations.append(f"torch.{name} in {Path(caller).name}")
            return original(*args, **kwargs)

        return counted

    def _wrap(self, name, original):
        @functools.wraps(original)
        def counted(tensor, *args, **kwargs):
            if self.inside_allowed:
                self.allowed_calls += 1
            else:
                self.violations.append(name)
            return original(tensor, *args, **kwargs)

        return counted

    def _allow(self, original):
        @functools.wraps(original)
        def allowed(*args, **kwargs):
            self.inside_allowed += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.inside_allowed -= 1

        return allowed


@pytest.fixture
def trainer():
    cfg = config.load(
        "smoke", ["model.width=8", "train.epochs=1", "train.log_every=4", "data.synthetic_train_size=512"]
    )
    ctx = dist.init(cfg.dist)
    return Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device))


def test_training_steps_do_not_sync_between_log_intervals(trainer, monkeypatch):
    rows = []
    trainer.hooks = [rows.append]
    next(trainer.train_loader.epoch(0))  # constants are built once, on first use: before counting
    with SyncCounter().installed(monkeypatch) as counter:
        trainer.fit()
    assert trainer.step == 8 and len([r for r in rows if r["kind"] == "train"]) == 2
    assert counter.violations == [], f"host syncs inside the step loop: {counter.violations}"
    assert counter.allowed_calls > 0  # the log intervals did read values back, where they may


def test_the_guard_notices_a_tensor_built_from_host_data_per_step(trainer, monkeypatch):
    # What normalize() once did: its mean and std built from Python tuples on every batch (uncached).
    from lab.run.data import augment

    monkeypatch.setattr(augment, "_affine", augment._affine.__wrapped__)
    with SyncCounter().installed(monkeypatch) as counter:
        trainer.fit()
    assert counter.violations.count("torch.tensor in augment.py") == 2 * 8  # mean and std, 8 steps


def test_the_guard_notices_a_sync(trainer, monkeypatch):
    # Prove the counter works: a step loop that reads the loss every step is caught.
    original = Trainer.forward_backward

    def forward_backward_with_item(self, inputs, labels, sync=True, scale=1.0):
        original(self, inputs, labels, sync, scale)
        self.meter.loss_sum.item()  # the habit the lab avoids

    monkeypatch.setattr(Trainer, "forward_backward", forward_backward_with_item)
    with SyncCounter().installed(monkeypatch) as counter:
        trainer.fit()
    assert counter.violations.count("item") == 8
