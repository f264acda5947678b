"""Host<->device copy bandwidth per GPU and the device-to-device matrix: what a PCIe link trained down shows.

    lab bench hostdevice                                    # every visible GPU, 256 MiB copies, 20 timed
    lab bench hostdevice --size 1G --iters 10 --json hostdevice.json

Per GPU: pinned host memory to the GPU (h2d) and back (d2h). For every pair (i, j) a copy from GPU i to GPU j
(row i, column j); [i][i] is a copy within GPU i (it reads and writes the size once each). One copy runs at a
time, so a PCIe switch that two GPUs share shows in neither figure. GB/s is 1e9 bytes per second: size x iters
over the time of `iters` copies, timed after WARMUP_ITERS untimed ones; the clock starts after the devices have
finished everything before and stops after they have finished the copies (CUDA copies are asynchronous). Torch
copies GPU to GPU over NVLink or PCIe peer access where the pair has it (`peer_access`), else through the host.

Without CUDA the same code runs with the CPU as the one "device" (host tensor to host tensor, no pinned memory)
and says "device": "cpu": the figures are then a CPU memory copy, not a GPU's.

The JSON (`--json PATH`; the fabric check's hostdevice-NODE.json, judged by `lab validate`):

    {"benchmark": "hostdevice", "method": "torch", "device": "cuda" | "cpu", "host": "dgx01",
     "size_bytes": 268435456, "iters": 20, "warmup_iters": 2, "pinned": true,
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "h2d_gbps": 55.2,
               "d2h_gbps": 55.4}, ...],
     "d2d_gbps": [[d2d 0->0, 0->1, ...], [1->0, 1->1, ...], ...],    # row: from, column: to
     "peer_access": [[true, true, ...], ...] | null}                 # null on the CPU

"index" is torch's (the GPUs CUDA_VISIBLE_DEVICES leaves, renumbered from 0); "uuid" is nvidia-smi's, to match
the node's facts. "method" is always "torch": nvbandwidth is not run (no GPU host has been lent to test it).
"""

from __future__ import annotations

import argparse
import functools
import socket
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from lab.errors import LabError

if TYPE_CHECKING:  # imported where used: `lab bench --help` must not wait for torch
    import torch

DEFAULT_SIZE = "256M"
DEFAULT_ITERS = 20
WARMUP_ITERS = 2  # the first copies pay for pinning pages, peer access being enabled and the copy engines waking


class Devices(Protocol):
    """What the measurement needs of the devices: buffers, a copy, and a wait for everything queued."""

    kind: str  # "cuda" or "cpu"
    names: list[str]
    uuids: list[str | None]

    def host_buffer(self, nbytes: int) -> Any: ...  # pinned on CUDA: a pageable buffer halves h2d
    def device_buffer(self, index: int, nbytes: int) -> Any: ...
    def copy(self, dst: Any, src: Any) -> None: ...  # may return before the copy is done (CUDA)
    def synchronize(self) -> None: ...  # every device has finished what was queued
    def peer_access(self) -> list[list[bool]] | None: ...
    def pinned(self, buffer: Any) -> bool: ...


class TorchDevices:
    """The visible CUDA devices, or the CPU as one device when there is none."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.kind = "cuda" if torch.cuda.is_available() else "cpu"
        count = torch.cuda.device_count() if self.kind == "cuda" else 1
        self.names = [torch.cuda.get_device_name(i) for i in range(count)] if self.kind == "cuda" else ["cpu"]
        self.uuids: list[str | None] = [_uuid(torch, i) for i in range(count)] if self.kind == "cuda" else [None]

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        return self.torch.ones(nbytes, dtype=self.torch.uint8, pin_memory=self.kind == "cuda")

    def device_buffer(self, index: int, nbytes: int) -> torch.Tensor:
        device = self.torch.device("cuda", index) if self.kind == "cuda" else self.torch.device("cpu")
        return self.torch.ones(nbytes, dtype=self.torch.uint8, device=device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)  # asynchronous from and to pinned memory: the copy engines alone

    def synchronize(self) -> None:
        if self.kind == "cuda":
            for index in range(len(self.names)):
                self.torch.cuda.synchronize(index)

    def peer_access(self) -> list[list[bool]] | None:
        if self.kind != "cuda":
            return None
        n = len(self.names)
        return [[i == j or bool(self.torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]

    def pinned(self, buffer: torch.Tensor) -> bool:
        return bool(buffer.is_pinned()) if self.kind == "cuda" else False


def _uuid(torch: ModuleType, index: int) -> str | None:
    try:
        return f"GPU-{torch.cuda.get_device_properties(index).uuid}"
    except Exception:
        return None


def seconds_for(
    devices: Devices, copy: Callable[[], None], iters: int, warmup: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds that `iters` calls of `copy` take on the devices, after `warmup` untimed ones."""
    for _ in range(warmup):
        copy()
    devices.synchronize()  # the warm-up's copies must not run into the timed ones
    started = clock()
    for _ in range(iters):
        copy()
    devices.synchronize()  # a CUDA copy returns when queued: stop the clock when the devices have done them
    return clock() - started


def measure(
    devices: Devices,
    size_bytes: int,
    iters: int,
    warmup: int = WARMUP_ITERS,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The result (the module's JSON, less "host") for `devices`: h2d and d2h per device, the d2d matrix."""
    n = len(devices.names)
    host = devices.host_buffer(size_bytes)
    sources = [devices.device_buffer(i, size_bytes) for i in range(n)]
    targets = [devices.device_buffer(i, size_bytes) for i in range(n)]

    def gbps(copy: Callable[[], None]) -> float:
        return size_bytes * iters / seconds_for(devices, copy, iters, warmup, clock) / 1e9

    gpus = [
        {
            "index": i,
            "name": devices.names[i],
            "uuid": devices.uuids[i],
            "h2d_gbps": gbps(functools.partial(devices.copy, targets[i], host)),
            "d2h_gbps": gbps(functools.partial(devices.copy, host, sources[i])),
        }
        for i in range(n)
    ]
    d2d = [[gbps(functools.partial(devices.copy, targets[j], sources[i])) for j in range(n)] for i in range(n)]
    return {
        "benchmark": "hostdevice",
        "method": "torch",
        "device": devices.kind,
        "size_bytes": size_bytes,
        "iters": iters,
        "warmup_iters": warmup,
        "pinned": devices.pinned(host),
        "gpus": gpus,
        "d2d_gbps": d2d,
        "peer_access": devices.peer_access(),
    }


def render(r: dict[str, Any]) -> str:
    what = "GPU" if r["device"] == "cuda" else "CPU (host memory to host memory: not a GPU's figure)"
    host = "pinned" if r["pinned"] else "pageable"
    lines = [
        f"host<->device copies on {r['host']}: {len(r['gpus'])} {what}, {r['size_bytes'] / 2**20:g} MiB x "
        f"{r['iters']} after {r['warmup_iters']} warm-ups, {host} host memory, {r['method']}; GB/s = 1e9 B/s",
        "| device | name | host->device | device->host |",
        "|---:|---|---:|---:|",
    ]
    lines += [f"| {g['index']} | {g['name']} | {g['h2d_gbps']:.1f} | {g['d2h_gbps']:.1f} |" for g in r["gpus"]]
    lines.append("device->device (row: from, column: to; the diagonal: a copy within one device)")
    lines.append("from\\to " + "".join(f"{j:>9}" for j in range(len(r["d2d_gbps"]))))
    lines += [f"{i:>7} " + "".join(f"{v:>9.1f}" for v in row) for i, row in enumerate(r["d2d_gbps"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from lab.measure.bench.comm.collective_plan import parse_size
    from lab.run.training import runs

    try:
        size_bytes = parse_size(args.size)
    except LabError as exc:
        raise LabError(f"--size: {exc}") from None
    devices = TorchDevices()
    try:
        result = measure(devices, size_bytes, args.iters)
    except RuntimeError as exc:  # torch.OutOfMemoryError is one: two buffers per device and one pinned
        if "out of memory" not in str(exc).lower():
            raise
        raise LabError(
            f"--size {args.size}: {size_bytes} bytes x 2 per {devices.kind} device (and once pinned on "
            f"the host) do not fit; use a smaller size, e.g. 256M"
        ) from None
    result["host"] = socket.gethostname()
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    return 0
