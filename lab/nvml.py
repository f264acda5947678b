"""NVML (nvidia-ml-py), the one place the lab talks to it: the driver version, and
which physical GPU a torch device is.

A torch device index counts the GPUs this process can see; NVML counts every GPU
of the host. `CUDA_VISIBLE_DEVICES` may list indices ("4,5") or UUIDs ("GPU-8f0c...",
as Slurm, Kubernetes and `docker --gpus device=...` write it), so the only reliable
link between the two is the device's UUID, which torch and NVML both report.

Everything here is optional: without nvidia-ml-py or a driver, callers get None.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Gpu(NamedTuple):
    handle: Any    # an NVML device handle
    index: int     # NVML's index of it: the host's numbering, as nvidia-smi and dcgm-exporter show it
    uuid: str


def _pynvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def driver_version() -> str | None:
    """The NVIDIA driver's version, or None without nvidia-ml-py or a driver."""
    try:
        return _text(_pynvml().nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver: the version is simply unknown
        return None


def torch_uuid(index: int) -> str:
    """NVML's name for torch's CUDA device `index`: "GPU-" and the UUID torch reports."""
    import torch

    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def gpu_of(index: int, uuid: str | None = None) -> Gpu:
    """The NVML device behind torch's CUDA device `index`, found by its UUID (never by position).

    Raises when NVML is missing or knows no GPU of that UUID; callers treat that as "no NVML"."""
    pynvml = _pynvml()
    uuid = uuid or torch_uuid(index)
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    return Gpu(handle, int(pynvml.nvmlDeviceGetIndex(handle)), uuid)
