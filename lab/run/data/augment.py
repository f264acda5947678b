"""Batched augmentation on the training device: random crop with 4-pixel zero
padding and horizontal flip, the CIFAR-10 recipe, without per-sample PIL work.

The random choices are drawn per sample index and epoch, not per rank, so a
sample is augmented the same way whichever rank trains on it. That is what makes
a 1-process run and an N-process run with the same global batch comparable step
by step.
"""

from __future__ import annotations

import functools

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


def pad(images: torch.Tensor) -> torch.Tensor:
    """Zero-pad uint8 images by 4 pixels on each side (B x 3 x 40 x 40); the loader does this once per data set."""
    return F.pad(images, (PAD, PAD, PAD, PAD))


def choices(offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Each sample's (row offset, column offset, flip) as one id in 0..161 (9 x 9 x 2 possibilities)."""
    return (offsets[:, 0] * (2 * PAD + 1) + offsets[:, 1]) * 2 + flips.long()


@functools.lru_cache(maxsize=8)
def _index_table(device: torch.device) -> torch.Tensor:
    """For every choice id, the 32x32 source positions in a flattened 40x40 padded image (162 x 1024).

    With only 162 distinct crops-and-flips, looking the index up is cheaper than computing it per batch;
    the flip is folded into the column order."""
    side, ar = SIZE + 2 * PAD, torch.arange(SIZE, device=device)
    rows = [(dy + ar) * side for dy in range(2 * PAD + 1)]
    cols = [[dx + ar, dx + SIZE - 1 - ar] for dx in range(2 * PAD + 1)]
    return torch.stack(
        [
            (rows[dy][:, None] + cols[dx][flip][None, :]).flatten()
            for dy in range(2 * PAD + 1)
            for dx in range(2 * PAD + 1)
            for flip in (0, 1)
        ]
    )


def crop_flip_padded(padded: torch.Tensor, choice_ids: torch.Tensor) -> torch.Tensor:
    """Per-sample 32x32 crops (and mirrors) of zero-padded images (B x 3 x 40 x 40), as one gather."""
    b, c, side = padded.shape[0], padded.shape[1], padded.shape[-1]
    index = torch.index_select(_index_table(padded.device), 0, choice_ids)
    index = index.view(b, 1, SIZE * SIZE).expand(b, c, SIZE * SIZE)
    return torch.gather(padded.reshape(b, c, side * side), 2, index).view(b, c, SIZE, SIZE)


def crop_flip(images: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Random crop with 4-pixel zero padding and horizontal flip of a uint8 batch (B x 3 x 32 x 32)."""
    return crop_flip_padded(pad(images), choices(offsets, flips))


@functools.lru_cache(maxsize=16)
def _affine(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) with (x - 255 mean) / (255 std) = x * scale + shift, built once per device and dtype.

    Built per batch, each would be a blocking host-to-device copy on CUDA: three per step, each
    waiting for the GPU to drain, so the host could never run ahead of the device."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (1 / (std * 255)).to(device, dtype), (-mean / std).to(device, dtype)


def normalize(images: torch.Tensor, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """uint8 images to normalised floats of `dtype` in the model's memory format.

    The affine map is an in-place multiply, then add: on a CPU, torch.addcmul doing the same
    in one call measured ~10x slower (13 ms against 1.1 ms for 512 images on 2 threads), and
    was most of the data path's time. The layout changes last: converting the uint8 crop to
    channels_last first measured slower in the loader (67k against 115k images/s).

    >>> x = normalize(torch.full((1, 3, 1, 1), 255, dtype=torch.uint8), torch.float64, channels_last=False)
    >>> [round(v, 4) for v in x.flatten().tolist()]
    [2.0591, 2.1265, 2.1158]
    """
    scale, shift = _affine(images.device, dtype)
    x = images.to(dtype, copy=True).mul_(scale).add_(shift)  # copy: never scale a caller's float tensor in place
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x
