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


def fused_optimizer_devices() -> tuple[str, ...]:
    """Device types with fused optimizer kernels, from the list torch's own optimizers check `fused=True`
    against (torch.utils._foreach_utils, in 2.6 and 2.14); CUDA alone where a build lacks it."""
    from torch.utils import _foreach_utils

    listed = getattr(_foreach_utils, "_get_fused_kernels_supported_devices", None)
    return tuple(listed()) if listed is not None else ("cuda",)


def ddp_buffer_sync(enabled: bool) -> dict[str, bool]:
    """DDP's keyword for syncing buffers before each forward: forward_sync_buffers in new releases,
    broadcast_buffers before (the lab's config key keeps the older, better-known name)."""
    from torch.nn.parallel import DistributedDataParallel

    names = inspect.signature(DistributedDataParallel).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers": enabled}


def fsdp_runs_on_cpu() -> bool:
    """FSDP2 on CPU tensors records events on CPU streams; torch 2.6's torch.cpu.Stream cannot
    ('Stream' object has no attribute 'record_event'), so FSDP there needs GPUs. Supplying no-op
    record_event/wait_event (as torch 2.14's are, CPU work being synchronous) is not enough: 2.6's FSDP2 then
    fails in the first backward ('one of the variables needed for gradient computation has been modified by
    an inplace operation: [torch.FloatTensor [64]] is at version 2'), so 2.6 keeps FSDP to GPUs."""
    import torch

    return hasattr(torch.cpu.Stream, "record_event")
