"""A pitfall's torchrun job: the parent starts it and reads one JSON report per rank.

    reports = run_job("lab.pitfalls.set_epoch", 2, "cpu", ["--epochs", "5"])   # parent: one dict per rank
    reports[0]["orders"]                                                       # rank 0's report

    args = parse_worker_args(argv)                  # in the worker: --out DIR --device cpu|cuda, and its own
    with process_group(args.device) as ctx:
        report(args.out, ctx.global_rank, {...})    # <DIR>/rank-<global rank>.json, written atomically

A job that fails, or outlives its time limit, raises JobFailed with the last line the workers printed;
torchrun is stopped with SIGTERM (it stops its workers), then killed, so no process is left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lab.cluster import launch

from lab.training import runs

JOB_TIMEOUT_SECONDS = 180   # a pitfall takes seconds; a job still running after this is stuck
STOP_GRACE_SECONDS = 15     # torchrun's own grace for its workers is shorter than this


class JobFailed(RuntimeError):
    """A pitfall's torchrun job crashed or hung: not a measured symptom, a failure (exit 1)."""


def default_world_size() -> int:
    """The GPUs of this host when there are two or more, else 2 CPU ranks (a pitfall needs two ranks)."""
    count = gpu_count()
    return count if count >= 2 else 2


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_device(world_size: int) -> str:
    """cuda when every rank can have a GPU of its own, else cpu (the lab's CPU path: gloo)."""
    return "cuda" if gpu_count() >= world_size else "cpu"


def run_job(module: str, world_size: int, device: str, args: list[str] | tuple[str, ...] = (),
            timeout_seconds: float = JOB_TIMEOUT_SECONDS, reports_expected: int | None = None) -> list[dict[str, Any]]:
    """Run `python -m module --out DIR --device DEVICE *args` on `world_size` ranks; return their reports, in
    rank order. `reports_expected`: how many ranks report (default: all of them)."""
    with tempfile.TemporaryDirectory(prefix="lab-pitfall-") as out:
        command = launch.torchrun_command(world_size, ["-m", module, "--out", out, "--device", device, *args])
        print(f"$ {shlex.join(command)}", flush=True)
        proc = subprocess.Popen(command, env=launch.worker_env(world_size),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = proc.communicate(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise JobFailed(f"{module} did not finish within {timeout_seconds:g} s") from None
        if proc.returncode != 0:
            raise JobFailed(f"{module} exited {proc.returncode}: {last_error_line(output)}")
        paths = sorted(Path(out).glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        reports = [runs.read_json(p) for p in paths]
    if len(reports) != (world_size if reports_expected is None else reports_expected):
        raise JobFailed(f"{module}: {len(reports)} of {world_size} ranks reported")
    return reports


def last_error_line(output: str) -> str:
    """The line of a failed job's output that says what went wrong: a worker's last exception line (not
    torchrun's own ChildFailedError, which only says that a worker failed), else the last line.

    >>> last_error_line("ValueError: bad\\n...\\ntorch.distributed.elastic...ChildFailedError: \\nboom FAILED\\n")
    'ValueError: bad'
    >>> last_error_line("/venv/bin/python: No module named lab.pitfalls.nope\\n")
    '/venv/bin/python: No module named lab.pitfalls.nope'
    >>> last_error_line("")
    'no output'
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "ChildFailedError" not in line
              and re.search(r"\b\w*(Error|Exception)\b:|No module named", line)]
    return ((errors or lines or ["no output"])[-1])[:300]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # torchrun passes SIGTERM on to its workers and waits for them
    try:
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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

