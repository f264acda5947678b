"""A probe's rank: its device (the rank's own GPU where there is one) and its process group (NCCL there, else gloo),
as the starters set them up. Shared by the probes that run a learner's function on every rank."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def setup() -> torch.device:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
