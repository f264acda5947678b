"""DistributedSampler semantics: each sample once per epoch across ranks, a new order each epoch."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from lab.run.data import DeviceLoader
from lab.run.data.sharding import order, shard


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("n", [30, 31, 32])
def test_join_covers_every_sample_exactly_once(world_size, n):
    for epoch in range(3):
        seen = Counter()
        for rank in range(world_size):
            seen.update(shard(order(n, 7, epoch, True), world_size, rank, "join").tolist())
        assert seen == Counter(range(n))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("n", [30, 31, 32])
def test_pad_covers_every_sample_and_repeats_only_to_even_out(world_size, n):
    shards = [shard(order(n, 7, 0, True), world_size, r, "pad").tolist() for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1
    seen = Counter(i for s in shards for i in s)
    assert set(seen) == set(range(n))
    assert sum(seen.values()) - n == (-n) % world_size  # exactly the padding, no more


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("n", [30, 31, 32])
def test_drop_never_repeats_and_drops_only_the_remainder(world_size, n):
    shards = [shard(order(n, 7, 0, True), world_size, r, "drop").tolist() for r in range(world_size)]
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == n - n % world_size


@pytest.mark.parametrize("uneven, drop_last", [("pad", False), ("drop", True)])
@pytest.mark.parametrize("world_size", [2, 3])
def test_same_indices_as_torch_distributed_sampler(uneven, drop_last, world_size):
    data = list(range(31))
    for epoch in range(3):
        for rank in range(world_size):
            sampler = DistributedSampler(
                data, num_replicas=world_size, rank=rank, shuffle=True, seed=5, drop_last=drop_last
            )
            sampler.set_epoch(epoch)
            assert shard(order(31, 5, epoch, True), world_size, rank, uneven).tolist() == list(sampler)


def test_orders_differ_between_epochs_and_repeat_for_a_seed():
    assert order(100, 0, 0, True).tolist() != order(100, 0, 1, True).tolist()
    assert order(100, 0, 1, True).tolist() == order(100, 0, 1, True).tolist()
    assert order(100, 0, 0, False).tolist() == list(range(100))


@pytest.mark.parametrize("world_size", [2, 3])
def test_loader_batches_cover_each_rank_shard(world_size):
    n, batch = 50, 4
    images, labels = torch.zeros(n, 3, 32, 32, dtype=torch.uint8), torch.arange(n)  # labels carry sample ids
    per_epoch = []
    for epoch in range(2):
        seen = []
        for rank in range(world_size):
            loader = DeviceLoader(
                images,
                labels,
                world_size=world_size,
                rank=rank,
                batch_size=batch,
                seed=1,
                shuffle=True,
                uneven="join",
                augment=True,
                dtype=torch.float32,
                keep_partial=True,
            )
            batches = [y.tolist() for _, y in loader.epoch(epoch)]
            assert len(batches) == loader.batches_per_epoch()
            seen += [i for b in batches for i in b]
        assert sorted(seen) == list(range(n))
        per_epoch.append(seen)
    assert per_epoch[0] != per_epoch[1]


def test_loader_resume_start_skips_whole_batches():
    images, labels = torch.zeros(40, 3, 32, 32, dtype=torch.uint8), torch.arange(40)
    loader = DeviceLoader(
        images,
        labels,
        world_size=2,
        rank=0,
        batch_size=4,
        seed=3,
        shuffle=True,
        uneven="pad",
        augment=False,
        dtype=torch.float32,
    )
    full = [y.tolist() for _, y in loader.epoch(1)]
    assert [y.tolist() for _, y in loader.epoch(1, start=2)] == full[2:]
