"""Synthetic CIFAR-shaped data: deterministic from a seed, and learnable.

Each class has a smooth colour pattern (a random 4x4 image upsampled to 32x32).
A sample is its class pattern at a random contrast, plus a random brightness
shift, a smooth distractor pattern of similar strength and pixel noise. A small
CNN separates the classes within a few hundred steps, while the task is not
solved in the first few: the loss curve has a shape worth comparing.

>>> images, labels = generate(100, seed=0, split="train")
>>> images.shape, images.dtype, labels.bincount().tolist()
(torch.Size([100, 3, 32, 32]), torch.uint8, [10, 10, 10, 10, 10, 10, 10, 10, 10, 10])
>>> bool((generate(100, seed=0, split="train")[0] == images).all())
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.run.data.layout import IMAGE_SHAPE, NUM_CLASSES

_SPLIT_STREAM = {"train": 1, "test": 2}
_CHUNK = 4096  # images generated at a time: bounds the float working memory


def _generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + stream)


def class_patterns(seed: int) -> torch.Tensor:
    """One smooth pattern per class, values roughly in [-1, 1], shared by train and test."""
    low = torch.rand(NUM_CLASSES, 3, 4, 4, generator=_generator(seed, 0)) * 2 - 1
    return F.interpolate(low, size=IMAGE_SHAPE[1:], mode="bicubic", align_corners=False)


def generate(count: int, seed: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` images (uint8, N x 3 x 32 x 32) and balanced labels for `split` ('train' or 'test')."""
    g = _generator(seed, _SPLIT_STREAM[split])
    patterns = class_patterns(seed)
    labels = (torch.arange(count) % NUM_CLASSES)[torch.randperm(count, generator=g)]
    images = torch.empty(count, *IMAGE_SHAPE, dtype=torch.uint8)
    for start in range(0, count, _CHUNK):
        y = labels[start : start + _CHUNK]
        n = len(y)
        contrast = 0.3 + torch.rand(n, 1, 1, 1, generator=g)
        brightness = (torch.rand(n, 3, 1, 1, generator=g) * 2 - 1) * 0.4
        distractor = F.interpolate(
            torch.rand(n, 3, 8, 8, generator=g) * 2 - 1, size=IMAGE_SHAPE[1:], mode="bilinear", align_corners=False
        )
        noise = torch.randn(n, *IMAGE_SHAPE, generator=g) * 0.2
        x = contrast * patterns[y] + brightness + 1.2 * distractor + noise
        images[start : start + n] = (128 + 64 * x).round().clamp(0, 255).to(torch.uint8)
    return images, labels
