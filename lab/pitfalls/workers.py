"""A pitfall's torchrun job: the parent starts it and reads one JSON report per rank.

    reports = run_job("lab.pitfalls.set_epoch", 2, "cpu", ["--epochs", "5"])   # parent: one dict per rank
    reports[0]["orders"]                                                       # rank 0's report

    args = parse_worker_args(argv)                  # in the worker: --out DIR --device cpu|cuda, and its own
    with process_group(args.device) as ctx:
        report(args.out, ctx.global_rank, {...})    # <DIR>/rank-<global rank>.json, written atomically

A job that fails, or outlives its time limit, raises JobFailed with the workers' line that says what went
wrong; the lab's runner (lab.cluster.runner) stops torchrun's whole process group, so no process is
left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab.cluster import cores, launch, runner
from lab.training import runs

JOB_TIMEOUT_SECONDS = 180   # a pitfall takes seconds; a job still running after this is stuck


class JobFailed(RuntimeError):
    """A pitfall's torchrun job crashed or hung: not a measured symptom, a failure (exit 1)."""


def default_world_size() -> int:
    """The GPUs of this host when there are two or more, else 2 CPU ranks (a pitfall needs two ranks)."""
    return cores.default_ranks(cores.gpu_count(), fewest_gpus=2)


def choose_device(world_size: int) -> str:
    """cuda when every rank can have a GPU of its own, else cpu (the lab's CPU path: gloo)."""
    return "cuda" if cores.gpu_count() >= world_size else "cpu"


def run_job(module: str, world_size: int, device: str, args: list[str] | tuple[str, ...] = (),
            timeout_seconds: float = JOB_TIMEOUT_SECONDS, reports_expected: int | None = None) -> list[dict[str, Any]]:
    """Run `python -m module --out DIR --device DEVICE *args` on `world_size` ranks; return their reports, in
    rank order. `reports_expected`: how many ranks report (default: all of them)."""
    with tempfile.TemporaryDirectory(prefix="lab-pitfall-") as out:
        command = launch.torchrun_command(world_size, ["-m", module, "--out", out, "--device", device, *args])
        done = runner.run(command, env=launch.worker_env(world_size), processes=world_size,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout_seconds=timeout_seconds)
        if done.timed_out:
            raise JobFailed(f"{module} did not finish within {timeout_seconds:g} s")
        if done.returncode != 0:
            raise JobFailed(f"{module} exited {done.returncode}: {done.last_error}")
        paths = sorted(Path(out).glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        reports = [runs.read_json(p) for p in paths]
    if len(reports) != (world_size if reports_expected is None else reports_expected):
        raise JobFailed(f"{module}: {len(reports)} of {world_size} ranks reported")
    return reports


# ----------------------------------------------------------------------------- the worker side


def parse_worker_args(argv: list[str], extra: dict[str, type] | None = None) -> argparse.Namespace:
    """--out DIR --device cpu|cuda, and the module's own integer/float options (`extra`: flag -> type).

    >>> parse_worker_args(["--out", "/tmp/x", "--device", "cpu", "--epochs", "3"], {"--epochs": int}).epochs
    3
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    for flag, kind in (extra or {}).items():
        parser.add_argument(flag, type=kind, required=True)
    return parser.parse_args(argv)


@contextlib.contextmanager
def process_group(device: str, timeout_seconds: float = 60.0) -> Iterator[Any]:
    """The lab's process group (lab.cluster.dist) on `device`: nccl on GPUs, gloo on the CPU. The timeout is
    short next to training's: a pitfall that hangs by mistake should fail in a minute, not in ten."""
    from lab.cluster import dist
    from lab.config import DistConfig

    with dist.initialized(DistConfig(device=device, timeout_seconds=timeout_seconds)) as ctx:
        yield ctx


def device_name(ctx: Any) -> str:
    """'cpu', or 'cuda (NVIDIA H200)': what a pitfall's JSON calls the device it ran on."""
    from lab.cluster import provenance

    name = provenance.describe(ctx)["device_name"]
    return "cpu" if ctx.device.type == "cpu" else f"cuda ({name})"


def report(out: str | Path, global_rank: int, obj: dict[str, Any]) -> None:
    runs.write_json(Path(out) / f"rank-{global_rank}.json", obj)

