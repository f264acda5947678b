"""A pitfall's torchrun job, through the lab's one job protocol (lab.run.cluster.jobs): the device and the pitfall's
own parameters handed down, one JSON report per rank gathered.

    reports = run_job("lab.course.pitfalls.set_epoch", 2, "cpu", {"epochs": 5})   # parent: one dict per rank
    reports[0]["orders"]                                                   # rank 0's report

    job = jobs.this_job(argv)                       # in the worker: job.params["device"], job.params["epochs"]
    with process_group(job.params["device"]) as ctx:
        job.report(ctx.global_rank, {...})          # <the job's folder>/rank-<global rank>.json

A job that fails, or outlives its time limit, raises JobFailed with the workers' line that says what went
wrong; the lab's runner stops torchrun's whole process group, so no process is left behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from lab.run.cluster import cores, jobs
from lab.run.cluster.jobs import JobFailed

__all__ = ["JobFailed", "choose_device", "default_world_size", "device_name", "process_group", "run_job"]

JOB_TIMEOUT_SECONDS = 180  # a pitfall takes seconds; a job still running after this is stuck


def default_world_size() -> int:
    """The GPUs of this host when there are two or more, else 2 CPU ranks (a pitfall needs two ranks)."""
    return cores.default_ranks(cores.gpu_count(), fewest_gpus=2)


def choose_device(world_size: int) -> str:
    """cuda when every rank can have a GPU of its own, else cpu (the lab's CPU path: gloo)."""
    return "cuda" if cores.gpu_count() >= world_size else "cpu"


def run_job(
    module: str, world_size: int, device: str, params: dict[str, Any] | None = None, reports_expected: int | None = None
) -> list[dict[str, Any]]:
    """Run `module`'s worker on `world_size` ranks with {"device": device, **params}; their reports, in rank order.
    `reports_expected`: how many ranks report (default: all of them)."""
    return jobs.run(
        jobs.Job(
            module,
            world_size,
            {"device": device, **(params or {})},
            timeout_seconds=JOB_TIMEOUT_SECONDS,
            reports=reports_expected,
        )
    )


# ----------------------------------------------------------------------------- the worker side


@contextlib.contextmanager
def process_group(device: Literal["auto", "cpu", "cuda"], timeout_seconds: float = 60.0) -> Iterator[Any]:
    """The lab's process group (lab.run.cluster.dist) on `device`: nccl on GPUs, gloo on the CPU. The timeout is
    short next to training's: a pitfall that hangs by mistake should fail in a minute, not in ten."""
    from lab.run.cluster import dist
    from lab.run.config import DistConfig

    with dist.initialized(DistConfig(device=device, timeout_seconds=timeout_seconds)) as ctx:
        yield ctx


def device_name(ctx: Any) -> str:
    """'cpu', or 'cuda (NVIDIA H200)': what a pitfall's JSON calls the device it ran on."""
    from lab.run.cluster import provenance

    name = provenance.describe(ctx)["device_name"]
    return "cpu" if ctx.device.type == "cpu" else f"cuda ({name})"
