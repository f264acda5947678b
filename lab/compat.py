"""Where the supported torch releases differ, one feature check each (never a version parse).

The lab supports torch 2.6 (NGC 25.01's) to the release pinned in constraints.txt;
CI runs the unit and distributed tests on both ends (`make test-torch-lowest`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable


def fully_shard() -> Callable:
    """FSDP2's `fully_shard`: public in torch.distributed.fsdp (so in PyPI's 2.6.0 and 2.14.1 wheels);
    torch.distributed._composable.fsdp where a build predates that (one such 2.6 was reported)."""
    try:
        from torch.distributed.fsdp import fully_shard as shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard as shard
    return shard


def ddp_buffer_sync(enabled: bool) -> dict[str, bool]:
    """DDP's keyword for syncing buffers before each forward: forward_sync_buffers in new releases,
    broadcast_buffers before (the lab's config key keeps the older, better-known name)."""
    from torch.nn.parallel import DistributedDataParallel

    names = inspect.signature(DistributedDataParallel).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers": enabled}


def fsdp_runs_on_cpu() -> bool:
    """FSDP2 on CPU tensors records events on CPU streams; torch 2.6's torch.cpu.Stream cannot
    ('Stream' object has no attribute 'record_event'), so FSDP there needs GPUs."""
    import torch

    return hasattr(torch.cpu.Stream, "record_event")
