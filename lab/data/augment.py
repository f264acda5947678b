"""Batched augmentation on the training device: random crop with 4-pixel zero
padding and horizontal flip, the CIFAR-10 recipe, without per-sample PIL work.

The random choices are drawn per sample index and epoch, not per rank, so a
sample is augmented the same way whichever rank trains on it. That is what makes
a 1-process run and an N-process run with the same global batch comparable step
by step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAD = 4
SIZE = 32

# CIFAR-10 channel statistics (of the training set, in [0, 1] units).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def plan(n: int, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Crop offsets (n x 2, in 0..8) and flips (n, bool) for every sample of an epoch."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 2 + 1)
    offsets = torch.randint(0, 2 * PAD + 1, (n, 2), generator=g)
    flips = torch.randint(0, 2, (n,), generator=g).bool()
    return offsets, flips


def crop_flip(images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Apply per-sample crops and flips to a uint8 batch (B x 3 x 32 x 32) in one gather."""
    b = images.shape[0]
    padded = F.pad(images, (PAD, PAD, PAD, PAD))
    ar = torch.arange(SIZE, device=images.device)
    rows = (offsets[:, 0, None] + ar)[:, None, :, None]
    cols = (offsets[:, 1, None] + ar)[:, None, None, :]
    batch = torch.arange(b, device=images.device)[:, None, None, None]
    channel = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
    out = padded[batch, channel, rows, cols]
    return torch.where(flips[:, None, None, None], out.flip(3), out)


def normalize(images: torch.Tensor, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """uint8 images to normalised floats of `dtype` in the model's memory format."""
    mean = torch.tensor(MEAN, device=images.device, dtype=dtype).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=images.device, dtype=dtype).view(1, 3, 1, 1) * 255
    x = (images.to(dtype) - mean) / std
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x
