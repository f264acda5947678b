"""The interval meter: device-side sums, one reduction per interval, throughput without the warm-up."""

from __future__ import annotations

import torch

from lab.run.cluster.dist import DistContext
from lab.run.training.meter import IntervalMeter, Throughput

ALONE = DistContext(0, 0, 1, 1, 0, torch.device("cpu"), None)  # world size 1: the reduction is the identity


def test_an_interval_holds_the_mean_loss_the_accuracy_and_the_samples_of_its_steps():
    meter = IntervalMeter(torch.device("cpu"), start_step=10)
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    meter.add(torch.tensor(1.0), logits, torch.tensor([0, 1, 1]))  # 2 of 3 right, mean loss 1
    meter.add(torch.tensor(4.0), logits[:1], torch.tensor([0]))  # 1 of 1 right, loss 4
    interval = meter.close(ALONE, step=12)
    assert (interval.step, interval.steps, interval.samples, interval.rank_samples) == (12, 2, 4, 4)
    assert interval.loss == (3 * 1.0 + 1 * 4.0) / 4 and interval.accuracy == 3 / 4
    assert interval.samples_per_second == 4 / interval.seconds


def test_closing_starts_the_next_interval_and_an_empty_one_is_none():
    meter = IntervalMeter(torch.device("cpu"), start_step=0)
    assert meter.close(ALONE, step=0) is None  # no step since the last close
    meter.add(torch.tensor(2.0), torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    first = meter.close(ALONE, step=1)
    meter.add(torch.tensor(3.0), torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
    second = meter.close(ALONE, step=2)
    assert (first.loss, first.accuracy) == (2.0, 0.0) and (second.loss, second.accuracy) == (3.0, 1.0)
    assert meter.loss_sum.item() == 0 and meter.correct.item() == 0 and meter.rank_samples == 0


def test_the_sums_stay_on_the_device_as_tensors():
    meter = IntervalMeter(torch.device("cpu"), start_step=0)
    meter.add(torch.tensor(2.0), torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    # Tensors, not Python numbers: adding to them never makes the host wait for a GPU.
    assert isinstance(meter.loss_sum, torch.Tensor) and meter.loss_sum.dtype == torch.float64
    assert isinstance(meter.correct, torch.Tensor) and meter.correct.dtype == torch.int64


def test_throughput_leaves_out_the_first_interval_unless_it_is_the_only_one():
    pace = Throughput()
    assert pace.samples_per_second is None
    pace.add(100, 10.0)  # warm-up: 10 img/s
    assert pace.samples_per_second == 10.0
    pace.add(600, 2.0)
    pace.add(400, 3.0)
    assert pace.samples_per_second == 200.0  # (600 + 400) / (2 + 3)


def test_closing_an_interval_builds_no_tensor_from_host_data(monkeypatch):
    # On CUDA torch.tensor(number, device=cuda) is a blocking host-to-device copy; a CPU run cannot see the copy,
    # so count the lab's calls that would make one (as tests/unit/test_sync_guard.py does for the step loop).
    calls = []
    for name in ("tensor", "as_tensor", "asarray", "from_numpy"):
        original = getattr(torch, name)
        monkeypatch.setattr(
            torch, name, lambda *a, _original=original, _name=name, **k: (calls.append(_name), _original(*a, **k))[1]
        )
    logits, labels, loss = torch.ones(3, 2), torch.zeros(3, dtype=torch.int64), torch.ones(())
    meter = IntervalMeter(torch.device("cpu"), start_step=0)
    meter.add(loss, logits, labels)
    interval = meter.close(ALONE, step=1)
    assert calls == [] and interval.samples == 3 and interval.loss == 1.0
