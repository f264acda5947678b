"""The host a room is planned on: its GPUs (or MIG slices), cores and memory, read here or given.

>>> host = Host(devices=("0", "1"), cores=tuple(range(8)), memory_bytes=64 * GIB)
>>> host.reserve_bytes // GIB, core_list(host.cores)
(6, '0-7')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lab.course.room.mig import _host_devices, planned_slices
from lab.errors import LabError

GIB = 2**30
# What the hub, its proxy, the OS and the page cache keep: a tenth of the host, at least 2 GiB.
HUB_RESERVE_FRACTION, HUB_RESERVE_MIN_BYTES = 0.10, 2 * GIB


@dataclass(frozen=True)
class Host:
    """What the room has to hand out."""

    devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries: GPU indices ("0".."7") or MIG UUIDs ("MIG-...")
    cores: tuple[int, ...]  # CPU core ids (this process's affinity)
    memory_bytes: int

    @property
    def reserve_bytes(self) -> int:
        return max(HUB_RESERVE_MIN_BYTES, int(self.memory_bytes * HUB_RESERVE_FRACTION))


def this_host(
    gpus: int | None = None,
    devices: str | None = None,
    cores: int | None = None,
    memory_gib: float | None = None,
    mig_per_gpu: int | None = None,
    whole_gpus: int = 0,
) -> Host:
    """This machine: its GPUs (NVML's count; their MIG instances where they have some), cores and memory; each can
    be given instead (`gpus`, a `devices` list, `cores`, `memory_gib`), to plan another host from here, and the GPUs
    planned as `mig_per_gpu` slices each but the last `whole_gpus` (a room's queue, lab.course.room.plan)."""
    from lab.run.cluster import nvml

    if mig_per_gpu is not None:
        if devices is not None:
            raise LabError(
                f"--mig-per-gpu {mig_per_gpu} with --devices: the devices are already named; give --gpus N "
                f"--mig-per-gpu K to plan slices that do not exist yet, or --devices MIG-... for ones that do"
            )
        count = nvml.device_count() if gpus is None else gpus
        split = max(0, count - whole_gpus)
        found = planned_slices(split, mig_per_gpu) + tuple(str(i) for i in range(split, count))
    elif devices is not None:
        found = tuple(d.strip() for d in devices.split(",") if d.strip())
        if not found or len(found) != len(devices.split(",")):
            raise LabError(
                f"--devices {devices!r}: an empty entry; give the seats' devices comma-separated, GPU indices or MIG "
                f"UUIDs (--devices 0,1,2,3 or --devices MIG-a,MIG-b), or leave --devices out for this host's GPUs"
            )
    elif gpus is not None:
        found = tuple(str(i) for i in range(gpus))
    else:
        found = _host_devices(nvml.device_count())
    if cores is not None:
        ids = tuple(range(cores))
    elif hasattr(os, "sched_getaffinity"):
        ids = tuple(sorted(os.sched_getaffinity(0)))
    else:
        ids = tuple(range(os.cpu_count() or 1))
    return Host(found, ids, int(memory_gib * GIB) if memory_gib is not None else _memory_bytes())


def _memory_bytes(meminfo: str = "/proc/meminfo") -> int:
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def core_list(cores: tuple[int, ...]) -> str:
    """Core ids as ranges (taskset's --cpu-list, Docker's cpuset).

    >>> core_list((0, 1, 2, 3, 8, 10, 11))
    '0-3,8,10-11'
    """
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)
