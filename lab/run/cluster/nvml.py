"""NVML (nvidia-ml-py), the one place the lab talks to it: the driver version, and
which physical GPU a torch device is.

A torch device index counts the GPUs this process can see; NVML counts every GPU
of the host. `CUDA_VISIBLE_DEVICES` may list indices ("4,5") or UUIDs ("GPU-8f0c...",
as Slurm, Kubernetes and `docker --gpus device=...` write it), so the only reliable
link between the two is the device's UUID, which torch and NVML both report.

Everything here is optional: without nvidia-ml-py or a driver, callers get None.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple


class Gpu(NamedTuple):
    handle: Any  # an NVML device handle
    # NVML's index of it: the host's numbering, as nvidia-smi and dcgm-exporter show it (not `index`, which would
    # hide the tuple's index method)
    nvml_index: int
    uuid: str


def _pynvml() -> ModuleType:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def driver_version() -> str | None:
    """The NVIDIA driver's version, or None without nvidia-ml-py or a driver."""
    try:
        return _text(_pynvml().nvmlSystemGetDriverVersion())
    except Exception:
        return None


def device_count() -> int:
    """GPUs the driver knows, whatever this process's CUDA_VISIBLE_DEVICES; 0 without NVML or a driver."""
    try:
        return int(_pynvml().nvmlDeviceGetCount())
    except Exception:
        return 0


def host_has_gpus() -> bool:
    """Whether this host has NVIDIA GPUs, whatever torch makes of them: NVML counts some, or the driver's
    device files exist (no nvidia-ml-py needed). Used to tell "no GPU" from "a GPU torch cannot use"."""
    from pathlib import Path

    return device_count() > 0 or any(Path("/dev").glob("nvidia[0-9]*"))


def torch_uuid(index: int) -> str:
    """The UUID torch reports for its CUDA device `index`: bare hex, without NVML's "GPU-"/"MIG-" prefix."""
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


def gpu_of(index: int, uuid: str | None = None) -> Gpu:
    """The NVML device behind torch's CUDA device `index`, found by its UUID (never by position).

    A whole GPU is "GPU-<uuid>" to NVML, a MIG instance "MIG-<uuid>"; a MIG instance is reported with
    its parent GPU's index. Raises when NVML is missing or knows no such device; callers treat that
    as "no NVML"."""
    pynvml = _pynvml()
    bare = uuid or torch_uuid(index)
    bare = bare.split("-", 1)[1] if bare.startswith(("GPU-", "MIG-")) else bare
    failure: Exception | None = None
    for prefix in ("GPU-", "MIG-"):
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(prefix + bare)
        except Exception as exc:
            failure = exc
            continue
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if prefix == "MIG-" else handle
        return Gpu(handle, int(pynvml.nvmlDeviceGetIndex(parent)), prefix + bare)
    raise failure or LookupError(bare)
