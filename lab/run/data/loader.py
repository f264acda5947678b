"""Batches for one rank, cut from a data set that lives on the training device.

The whole data set is one uint8 tensor on the device (CIFAR-10's training set is
150 MiB), so a batch is an index, a gather, a batched crop/flip and a normalise:
no worker processes, no per-sample Python, no host-to-device copy per step.

>>> import torch
>>> images, labels = torch.zeros(10, 3, 32, 32, dtype=torch.uint8), torch.arange(10)
>>> loader = DeviceLoader(images, labels, world_size=2, rank=1, batch_size=2, seed=0, shuffle=False,
...                       uneven="pad", augment=False, dtype=torch.float32)
>>> [y.tolist() for _, y in loader.epoch(0)]
[[1, 3], [5, 7]]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from lab.run.data import augment as aug
from lab.run.data.sharding import batch_count, order, shard


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An epoch's host-made indices on `device`, without making the host wait when it is a GPU.

    From pageable memory a non_blocking copy to CUDA still waits (CUDA stages it through a pinned buffer first);
    from pinned memory it is a true asynchronous copy. Pinned once per epoch, not once for the run: each epoch's
    order is new, and torch's caching host allocator reuses the pinned block only after the copy that read it has
    finished (a buffer of our own, refilled next epoch, could be overwritten under a copy still queued).
    """
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


class DeviceLoader:
    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        *,
        world_size: int,
        rank: int,
        batch_size: int,
        seed: int,
        shuffle: bool,
        uneven: str,
        augment: bool,
        dtype: torch.dtype,
        channels_last: bool = False,
        keep_partial: bool = False,
    ) -> None:
        # Augmenting: keep the data set zero-padded once (1.56x the bytes) instead of padding every batch.
        self.images = aug.pad(images) if augment else images
        self.labels = labels
        self.world_size, self.rank, self.batch_size = world_size, rank, batch_size
        self.seed, self.shuffle, self.uneven, self.augment = seed, shuffle, uneven, augment
        self.dtype, self.channels_last, self.keep_partial = dtype, channels_last, keep_partial

    @property
    def device(self) -> torch.device:
        return self.images.device

    def batches_per_epoch(self, rank: int | None = None) -> int:
        """Batches `rank` (default: this one) gets per epoch; a pure function, so every rank knows every rank's."""
        return batch_count(
            len(self.labels),
            self.world_size,
            self.rank if rank is None else rank,
            self.uneven,
            self.batch_size,
            self.keep_partial,
        )

    def indices(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices for `epoch`, in order."""
        epoch_order = order(len(self.labels), self.seed, epoch, self.shuffle)
        return shard(epoch_order, self.world_size, self.rank, self.uneven)

    def forever(self, epoch: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of `epoch`, then of the next epochs, without end (for benchmarks that time steps)."""
        return itertools.chain.from_iterable(self.epoch(e) for e in itertools.count(epoch))

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(inputs, labels) batches of `epoch`, beginning at batch `start` (for resume)."""
        idx = to_device(self.indices(epoch), self.device)
        if self.augment:
            choice_ids = to_device(aug.choices(*aug.plan(len(self.labels), self.seed, epoch)), self.device)
        for i in range(start, self.batches_per_epoch()):
            sel = idx[i * self.batch_size : (i + 1) * self.batch_size]
            # index_select, not tensor[sel]: the same gather, many times faster for whole images on a CPU
            images = torch.index_select(self.images, 0, sel)
            if self.augment:
                images = aug.crop_flip_padded(images, torch.index_select(choice_ids, 0, sel))
            yield aug.normalize(images, self.dtype, self.channels_last), torch.index_select(self.labels, 0, sel)
