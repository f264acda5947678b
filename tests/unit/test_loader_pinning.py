"""The loader's per-epoch indices reach a GPU by a truly asynchronous copy: pinned first, then non_blocking.

No GPU here: the loader is told its device is CUDA (its `device` property), Tensor.to leaves the tensor where it
is, and Tensor.pin_memory (which needs a driver) is recorded instead of run. The batches are then cut on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from lab.run.data import loader as loading


@pytest.fixture
def copies(monkeypatch):
    seen = []

    def pin_memory(tensor, *args, **kwargs):
        seen.append(("pin", tuple(tensor.shape)))
        return tensor

    def to(tensor, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        if isinstance(device, torch.device) and device.type == "cuda":
            seen.append(("to", tuple(tensor.shape), kwargs.get("non_blocking", False)))
            return tensor
        return original_to(tensor, *args, **kwargs)

    original_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.Tensor, "to", to)
    return seen


def _loader(augment: bool) -> loading.DeviceLoader:
    images, labels = torch.zeros(8, 3, 32, 32, dtype=torch.uint8), torch.arange(8)
    return loading.DeviceLoader(
        images,
        labels,
        world_size=2,
        rank=0,
        batch_size=2,
        seed=0,
        shuffle=True,
        uneven="pad",
        augment=augment,
        dtype=torch.float32,
    )


def test_on_cuda_each_epochs_indices_are_pinned_before_their_non_blocking_copy(monkeypatch, copies):
    monkeypatch.setattr(loading.DeviceLoader, "device", property(lambda self: torch.device("cuda", 0)))
    batches = list(_loader(augment=True).epoch(0))
    assert len(batches) == 2
    # this rank's 4 indices, then the 8 crop/flip choices: each pinned, then copied without waiting
    assert copies == [("pin", (4,)), ("to", (4,), True), ("pin", (8,)), ("to", (8,), True)]


def test_on_a_cpu_nothing_is_pinned(copies):
    assert len(list(_loader(augment=True).epoch(0))) == 2
    assert copies == []  # pinning is for host-to-GPU copies; on a CPU it would only cost (and needs a driver)
