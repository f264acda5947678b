"""Which samples each rank sees, with torch's DistributedSampler semantics.

Every epoch has one order for all ranks (a permutation seeded by seed + epoch,
exactly as DistributedSampler does), and rank r takes every world_size-th index
starting at r. When the samples do not split evenly, `uneven` decides:

- pad:  repeat indices from the start of the order until they split evenly
        (DistributedSampler's drop_last=False);
- drop: drop the tail of the order (drop_last=True);
- join: neither; ranks get shards that differ by one sample and DDP's Join
        context covers the ranks that finish first.

>>> [shard(order(5, seed=0, epoch=0, shuffle=False), 2, r, "pad").tolist() for r in range(2)]
[[0, 2, 4], [1, 3, 0]]
>>> [shard(order(5, seed=0, epoch=0, shuffle=False), 2, r, "drop").tolist() for r in range(2)]
[[0, 2], [1, 3]]
>>> [shard(order(5, seed=0, epoch=0, shuffle=False), 2, r, "join").tolist() for r in range(2)]
[[0, 2, 4], [1, 3]]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def order(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The epoch's sample order, shared by all ranks."""
    import torch  # here, not at the top: the counts below plan a run's steps in a launcher that imports no torch

    if not shuffle:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(n, generator=g)


def shard_size(n: int, world_size: int, rank: int, uneven: str) -> int:
    if uneven == "pad":
        return math.ceil(n / world_size)
    if uneven == "drop":
        return n // world_size
    return len(range(rank, n, world_size))


def batch_count(n: int, world_size: int, rank: int, uneven: str, batch_size: int, keep_partial: bool) -> int:
    """Batches rank `rank` cuts from its shard per epoch; a partial last batch only when `keep_partial`
    (under Join, where ranks may differ by a batch)."""
    share = shard_size(n, world_size, rank, uneven)
    return math.ceil(share / batch_size) if keep_partial else share // batch_size


def shard(epoch_order: torch.Tensor, world_size: int, rank: int, uneven: str) -> torch.Tensor:
    """Rank `rank`'s indices out of `epoch_order`."""
    n = len(epoch_order)
    if uneven == "pad":
        total = math.ceil(n / world_size) * world_size
        repeats = math.ceil(total / n)
        epoch_order = epoch_order.repeat(repeats)[:total]
    elif uneven == "drop":
        epoch_order = epoch_order[: n // world_size * world_size]
    return epoch_order[rank::world_size]
