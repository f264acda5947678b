"""Device memory as the lab reports it: allocated now and the peak, in bytes."""

from __future__ import annotations

import os

import torch


def memory_bytes(device: torch.device) -> tuple[int, int]:
    """(allocated now, peak) on `device`; on the CPU the process's resident memory."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc (macOS): the peak is the best figure there is
        resident = peak
    return resident, peak
