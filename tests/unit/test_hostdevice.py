"""`lab bench hostdevice`: pinned host<->device copies per GPU and the GPU-to-GPU matrix, and its JSON.

No GPU here. The command runs for real on the CPU, which stands in as the one device (host memory to host memory,
nothing pinned), so the arguments, the JSON and the gpu-check step that reads it are exercised by real copies; the
GPU path (CUDA devices, pinned memory, peer copies) runs in `make gpu-check` (its host<->device step fails unless
the copies ran on CUDA from pinned memory). A CPU copy is synchronous, so nothing real here can show an
asynchronous copy: that class of bug (the clock read before the device has finished, the warm-up's copies counted
in the time, the matrix's rows and columns swapped) is caught with fake devices whose copies return at once and
whose clock moves only as they work, as CUDA's do.
"""

from __future__ import annotations

import json
import math
import shlex

import pytest

from lab.machine.devicecheck import bench_steps as gpu_steps
from lab.machine.devicecheck import command as gpu_check
from lab.machine.devicecheck import harness
from lab.measure.bench.comm import hostdevice
from tests.conftest import PYTHON, lab, run

DOCUMENTED = ".venv/bin/lab bench hostdevice --size 64M --iters 5 --json hostdevice.json"  # docs/benchmarks.md


class AsyncDevices:
    """Devices whose copies are queued and take `nbytes / rate` seconds of device time each; `clock` moves only
    when synchronize() waits for them, as a host's clock sees CUDA's asynchronous copies."""

    kind = "fake"

    def __init__(self, rates: dict[tuple[object, object], float]) -> None:
        self.rates = rates  # (source, destination) -> bytes per second; "host" for the host
        self.names = sorted({d for pair in rates for d in pair if d != "host"}, key=str)  # the GPUs: 0, 1, ...
        self.uuids = [None] * len(self.names)
        self.now = self.queued = 0.0

    def host_buffer(self, nbytes: int):
        return ("host", nbytes)

    def device_buffer(self, index: int, nbytes: int):
        return (self.names[index], nbytes)

    def copy(self, dst, src) -> None:
        self.queued += src[1] / self.rates[(src[0], dst[0])]

    def synchronize(self) -> None:
        self.now, self.queued = self.now + self.queued, 0.0

    def clock(self) -> float:
        return self.now

    def peer_access(self):
        return None

    def pinned(self, buffer) -> bool:
        return True


def test_each_figure_is_its_own_copy_timed_from_start_to_the_devices_finishing_it():
    # A different rate for every direction and ordered pair: a swapped row and column, a warm-up counted in the
    # time (rate x iters / (iters + warm-ups)) or a clock stopped before the devices finished (no time at all)
    # would each give other figures.
    gb = 1e9
    rates = {
        ("host", 0): 50 * gb,
        (0, "host"): 40 * gb,
        ("host", 1): 25 * gb,
        (1, "host"): 20 * gb,
        (0, 0): 2000 * gb,
        (0, 1): 300 * gb,
        (1, 0): 100 * gb,
        (1, 1): 1500 * gb,
    }
    devices = AsyncDevices(rates)
    result = hostdevice.measure(devices, size_bytes=256 * 2**20, iters=10, warmup=3, clock=devices.clock)
    assert [(g["index"], g["h2d_gbps"], g["d2h_gbps"]) for g in result["gpus"]] == [
        (0, pytest.approx(50), pytest.approx(40)),
        (1, pytest.approx(25), pytest.approx(20)),
    ]
    assert result["d2d_gbps"] == [[pytest.approx(2000), pytest.approx(300)], [pytest.approx(100), pytest.approx(1500)]]
    assert (result["size_bytes"], result["iters"], result["warmup_iters"]) == (256 * 2**20, 10, 3)
    # The fake is what a CUDA host sees: a copy returns before its time has passed.
    devices.copy(("host", gb), (0, gb))
    assert devices.clock() == devices.now and devices.queued > 0


def test_a_timing_that_does_not_wait_for_the_devices_is_caught_by_the_fake():
    waited, unwaited = AsyncDevices({("host", 0): 1e9}), AsyncDevices({("host", 0): 1e9})
    unwaited.synchronize = lambda: None  # the bug: the clock read while the copies are still queued
    for devices, seconds in ((waited, 4.0), (unwaited, 0.0)):
        copy = lambda d=devices: d.copy((0, 10**9), ("host", 10**9))  # noqa: E731 - 1 GB at 1 GB/s
        assert hostdevice.seconds_for(devices, copy, 4, 1, devices.clock) == pytest.approx(seconds)


def test_the_documented_command_runs_on_the_cpu_and_writes_the_schema(tmp_path):
    argv = shlex.split(DOCUMENTED)
    proc = run([PYTHON, "-m", "lab", *argv[1:]], cwd=tmp_path)
    r = json.loads((tmp_path / "hostdevice.json").read_text())
    assert {"method", "size_bytes", "iters", "gpus", "d2d_gbps"} <= r.keys()
    assert (r["benchmark"], r["method"], r["device"], r["pinned"]) == ("hostdevice", "torch", "cpu", False)
    assert (r["size_bytes"], r["iters"], r["peer_access"]) == (64 * 2**20, 5, None)
    [cpu] = r["gpus"]
    assert cpu.keys() >= {"index", "name", "h2d_gbps", "d2h_gbps"} and (cpu["index"], cpu["name"]) == (0, "cpu")
    figures = [cpu["h2d_gbps"], cpu["d2h_gbps"], *r["d2d_gbps"][0]]
    assert len(r["d2d_gbps"]) == 1 and all(math.isfinite(v) and 0 < v < 1e4 for v in figures), figures
    assert "CPU (host memory to host memory: not a GPU's figure)" in proc.stdout.splitlines()[0]


def test_bad_sizes_and_counts_are_one_line_and_exit_2():
    for args, says in (
        (["--size", "0"], "lab: error: --size: size '0': must be at least 1 byte"),
        (["--size", "1X"], "lab: error: --size: size '1X': expected bytes with an optional K, M or G"),
        (["--iters", "0"], "lab: error: argument --iters: 0; use 1 or more"),
    ):
        proc = lab("bench", "hostdevice", *args, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().startswith(says), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_the_gpu_check_step_fails_copies_that_ran_on_the_cpu_and_reads_a_gpu_result(tmp_path, monkeypatch):
    # The step's child runs for real (on this CPU: unpinned host copies, which must not pass on a GPU host).
    check = gpu_check.Harness(out=tmp_path, quick=True, gpu=True, gpus=1)
    with pytest.raises(harness.StepFailed, match="copies ran on cpu with pageable host memory, not CUDA and pinned"):
        gpu_steps.host_device(check)
    assert (tmp_path / "hostdevice.log").read_text().startswith("$ ")
    # A 2-GPU result, written by hand (no GPU here): the line the table shows of it.
    gpus = [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}", "h2d_gbps": 55.0 + i, "d2h_gbps": 52.0}
        for i in range(2)
    ]
    result = {
        "benchmark": "hostdevice",
        "method": "torch",
        "device": "cuda",
        "size_bytes": 256 * 2**20,
        "iters": 20,
        "warmup_iters": 2,
        "pinned": True,
        "gpus": gpus,
        "d2d_gbps": [[1500.0, 360.0], [355.0, 1500.0]],
        "peer_access": [[True, True], [True, True]],
    }
    monkeypatch.setattr(
        gpu_check.Harness, "lab", lambda self, log, *a: (tmp_path / "hostdevice.json").write_text(json.dumps(result))
    )
    outcome = gpu_steps.host_device(gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=2))
    assert outcome.detail == (
        "2 GPU(s), pinned, 256 MiB (GB/s): host->device 55.0-56.0, device->host 52.0, "
        "within a GPU 1500.0, GPU to GPU 355.0-360.0"
    )
    with pytest.raises(harness.StepFailed, match="2-row matrix for 3 GPU"):  # fewer GPUs than the host has
        gpu_steps.host_device(gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=3))
