"""Where a number came from: versions, this rank's host and device, the environment that steers NCCL and gloo.

Recorded in every run's manifest and every benchmark's JSON, so a figure can be traced to what made it.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # types only: describe() reads a context; it needs nothing else of dist
    from lab.run.cluster.dist import DistContext

# Environment worth recording with every run: it changes what NCCL and gloo do.
RECORDED_ENV_PREFIXES = (
    "NCCL_",
    "GLOO_",
    "TORCH_NCCL_",
    "TORCH_DISTRIBUTED_",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_",
    "UCX_",
)


def describe(ctx: DistContext) -> dict[str, Any]:
    """This process's part of the run manifest."""
    info = {
        "host": socket.gethostname(),
        "global_rank": ctx.global_rank,
        "local_rank": ctx.local_rank,
        "node_rank": ctx.node_rank,
        "device": str(ctx.device),
        "threads": torch.get_num_threads(),
    }
    if os.environ.get("SLURMD_NODENAME"):  # under Slurm: the node's name in the allocation (hosts may share a name)
        info["slurm_node"] = os.environ["SLURMD_NODENAME"]
    if ctx.device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(ctx.device)
    else:
        info["device_name"] = "cpu"
    return info


def recorded_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


def versions() -> dict[str, str | None]:
    import platform

    import torchvision

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    from lab.run.cluster import nvml

    driver = nvml.driver_version() if cuda else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": str(torch.backends.cudnn.version()) if cuda and torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "driver": driver,
    }
