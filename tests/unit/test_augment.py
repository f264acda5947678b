"""Batched crop and flip equal the per-sample recipe (pad 4 with zeros, crop 32, mirror)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lab.run.data import augment


def test_crop_flip_matches_per_sample_reference():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=g)
    offsets, flips = augment.plan(16, seed=0, epoch=0)
    out = augment.crop_flip(images, offsets, flips)
    for i in range(16):
        padded = F.pad(images[i], (4, 4, 4, 4))
        dy, dx = offsets[i].tolist()
        expected = padded[:, dy : dy + 32, dx : dx + 32]
        if flips[i]:
            expected = expected.flip(-1)
        assert torch.equal(out[i], expected)


def test_plan_depends_on_epoch_and_covers_all_offsets():
    a, fa = augment.plan(5000, seed=0, epoch=0)
    b, _ = augment.plan(5000, seed=0, epoch=1)
    assert not torch.equal(a, b)
    assert set(a.flatten().tolist()) == set(range(9))
    assert 0.4 < fa.float().mean() < 0.6


def test_normalize_channels_last_and_dtype():
    x = augment.normalize(torch.full((2, 3, 32, 32), 128, dtype=torch.uint8), torch.float64, channels_last=True)
    assert x.dtype == torch.float64 and x.is_contiguous(memory_format=torch.channels_last)
    assert abs(x[0, 0, 0, 0].item() - (128 / 255 - augment.MEAN[0]) / augment.STD[0]) < 1e-9
