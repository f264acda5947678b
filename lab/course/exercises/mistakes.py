"""Errors a learner's run raises that are known mistakes, each with what to do instead: the hint on the crash's own
line of the checklist, where "read the first error" would leave the learner to guess.

>>> hint("ValueError: sampler option is mutually exclusive with shuffle").split(":")[0]
'a DataLoader given a sampler takes no shuffle=True'
>>> hint("RuntimeError: Cannot use ReduceOp.AVG with Gloo").split(":")[0]
"this torch's gloo has no ReduceOp.AVG (NCCL has; gloo gained it in later torch releases)"
>>> hint("IndexError: tuple index out of range") is None  # an index error with no chunk in sight: not this mistake
True
"""

from __future__ import annotations

import re

KNOWN = (
    (
        re.compile(r"sampler option is mutually exclusive with shuffle"),
        "",
        "a DataLoader given a sampler takes no shuffle=True: the DistributedSampler shuffles (call its "
        "set_epoch(epoch) at each epoch)",
    ),
    (
        re.compile(r"SyncBatchNorm (expected input tensor to be on GPU|layers only work with GPU)"),
        "",
        "SyncBatchNorm runs on GPUs only: convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) where "
        "the ranks have GPUs (if next(model.parameters()).is_cuda); on the CPU do what it does yourself: a "
        "BatchNorm whose training forward all-reduces its per-channel sum, sum of squares and count "
        "(torch.distributed.nn.functional.all_reduce, which carries the gradient back) and uses those statistics",
    ),
    (
        re.compile(r"Cannot use ReduceOp\.AVG with Gloo"),
        "",
        "this torch's gloo has no ReduceOp.AVG (NCCL has; gloo gained it in later torch releases): all_reduce with "
        "the default ReduceOp.SUM, then divide by dist.get_world_size()",
    ),
    (
        re.compile(r"IndexError: (tuple|list) index out of range"),
        "chunk",  # only where the traceback shows a chunk split
        "torch.chunk(t, world_size) returns fewer pieces than ranks when t has fewer elements than ranks (1 element "
        "on 2 ranks: one piece); torch.tensor_split(t, world_size) always returns world_size pieces, some empty",
    ),
)


def hint(output: str) -> str | None:
    """What to do about the known mistake the output's error shows; None for any other error."""
    for pattern, also, what in KNOWN:
        if pattern.search(output) and also in output:
            return what
    return None
