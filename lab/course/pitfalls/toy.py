"""The tiny data and model the pitfalls train: seconds on two CPU cores, so the symptom is the lesson.

Gaussian blobs: CLASSES classes in FEATURES dimensions, each around a fixed centre (the same on every
rank and in every run), with enough noise that the classes overlap and the loss does not drop to zero
at once. A sample's class is chosen by its index, so a shard by class is a shard by index too.

>>> x, y = blobs(6, seed=0)
>>> tuple(x.shape), y.tolist()
((6, 8), [0, 1, 2, 3, 0, 1])
>>> blobs(4, seed=0, classes=[1, 3])[1].tolist()
[1, 3, 1, 3]
>>> sum(p.numel() for p in mlp("batch").parameters()), sum(b.numel() for b in mlp("batch").buffers())
(244, 33)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

FEATURES = 8
CLASSES = 4
HIDDEN = 16
CENTRE_SEED = 1234  # the class centres: one fixed set, whatever the data seed
CENTRE_SCALE = 2.0  # how far apart the classes sit, in units of the noise


def blobs(n: int, seed: int, classes: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` samples (x: n x FEATURES float32, y: n int64), classes cycling over `classes` (default: all)."""
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(CENTRE_SEED)) * CENTRE_SCALE
    chosen = torch.tensor(list(range(CLASSES)) if classes is None else list(classes))
    y = chosen[torch.arange(n) % len(chosen)]
    noise = torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed))
    return centres[y] + noise, y


def mlp(norm: str = "none", seed: int = 0) -> nn.Sequential:
    """Linear -> norm -> ReLU -> Linear, initialised from `seed` (DDP would broadcast rank 0's weights anyway;
    the same seed makes the broken and the fixed run start from the same point).

    norm: "none", "batch" (BatchNorm1d: running mean and variance are buffers), "group" (GroupNorm: none)."""
    torch.manual_seed(seed)
    layers: dict[str, nn.Module] = {
        "none": nn.Identity(),
        "batch": nn.BatchNorm1d(HIDDEN),
        "group": nn.GroupNorm(4, HIDDEN),
    }
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), layers[norm], nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
