"""A job of N ranks that each report JSON: the one way the lab starts a worker module and gathers what it measured.

The parent describes the job (the module, the rank count, its parameters and the config, already checked) and
`run` writes them into a folder of the job's own, starts `python -m MODULE --job FOLDER` on every rank through
torchrun (or horovodrun, or alone for a job of one process without a process group), through the lab's runner
(lab.run.cluster.runner: signals passed on, the process group stopped however it ends, a time limit), and returns
each rank's report in rank order:

    reports = jobs.run(Job("lab.course.pitfalls.set_epoch", 2, params={"epochs": 5, "device": "cpu"}))   # the parent
    reports[0]["orders"]                                                                            # rank 0's

    job = jobs.this_job(sys.argv[1:])   # in the worker: job.params, job.config (read, never parsed again)
    job.report(ctx.global_rank, {...})  # FOLDER/rank-<global rank>.json, written atomically

A job that fails, outlives its time limit, or ends with fewer reports than expected raises JobFailed carrying
the line that says what went wrong and the end of its output; nothing of it is left running.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lab import atomic
from lab.run.cluster import child_output, hang, launch, runner
from lab.run.config import Config, from_dict, to_dict

JOB_FILE = "job.json"


class JobFailed(RuntimeError):
    """A job crashed, hung past its limit or did not report: `reason` in one line, `output` its last lines."""

    def __init__(self, reason: str, output: str = "", returncode: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.output, self.returncode = reason, output, returncode

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class Job:
    module: str  # run as `python -m MODULE --job FOLDER` on every rank
    world_size: int
    params: dict[str, Any] = field(default_factory=dict)  # JSON values the worker reads as job.params
    config: Config | None = None  # the config the parent checked; the worker gets it as is
    launcher: Literal["torchrun", "horovodrun", "none"] = "torchrun"  # none: one plain process
    env: dict[str, str] | None = None  # the environment (default: the lab's torchrun one, threads split)
    timeout_seconds: float | None = None  # stopped past this, and JobFailed
    reports: int | None = None  # how many ranks report (default: all of them)
    log: Path | None = None  # the job's output into this file (default: kept for JobFailed)


def run(job: Job) -> list[dict[str, Any]]:
    """Run `job` to its end; its ranks' reports in rank order, or JobFailed."""
    with tempfile.TemporaryDirectory(prefix="lab-job-") as tmp:
        folder = Path(tmp)
        _write_job(folder, job)
        done = _start(job, folder)
        if done.timed_out:
            raise JobFailed(
                f"{job.module} did not finish within {job.timeout_seconds:g} s{_hang(job, folder, done)}",
                _output(job, done),
            )
        if done.returncode != 0:
            output = _output(job, done)
            said = child_output.last_error_line(output)
            raise JobFailed(
                f"{job.module} exited {done.returncode}: {said}{_hang(job, folder, done)}",
                output,
                done.returncode,
            )
        paths = sorted(folder.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        reports = [_read_json(p) for p in paths]
    expected = job.world_size if job.reports is None else job.reports
    if len(reports) != expected:
        raise JobFailed(f"{job.module}: {len(reports)} of {expected} ranks reported", _output(job, done))
    return reports


def _hang(job: Job, folder: Path, done: runner.Finished) -> str:
    """'; ' and which rank waited in which collective, where the ranks' watchdogs left their records."""
    found = hang.after_failure(folder, job.world_size, _output(job, done).splitlines())
    return f"; {found[0]['summary']}" if found else ""


def _write_job(folder: Path, job: Job) -> None:
    _write_json(
        folder / JOB_FILE,
        {
            "module": job.module,
            "world_size": job.world_size,
            "params": job.params,
            "config": to_dict(job.config) if job.config else None,
            "origin": job.config.origin if job.config else None,
        },
    )


def _start(job: Job, folder: Path) -> runner.Finished:
    target = ["-m", job.module, "--job", str(folder)]
    n = job.world_size
    if job.launcher == "horovodrun":
        from lab.run.cluster.horovodrun import horovodrun_command

        timeout = job.config.dist.timeout_seconds if job.config else 600
        command = horovodrun_command(n, target, timeout_seconds=timeout)
    elif job.launcher == "none":
        command = [sys.executable, *target]
    else:
        command = launch.torchrun_command(n, target)
    env = {**(job.env if job.env is not None else launch.worker_env(n)), hang.FOLDER_ENV: str(folder)}
    if job.log is None:
        return runner.run(
            command,
            env=env,
            processes=n,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout_seconds=job.timeout_seconds,
            echo=False,
        )
    with open(job.log, "w") as f:
        f.write(f"$ {' '.join(command)}\n")
        f.flush()
        return runner.run(
            command,
            env=env,
            processes=n,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout_seconds=job.timeout_seconds,
            echo=False,
        )


def _output(job: Job, done: runner.Finished) -> str:
    if job.log is not None:
        return job.log.read_text(errors="replace")[-20000:]
    return done.stdout


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _write_json(path: Path, obj: Any) -> None:
    atomic.write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


# ----------------------------------------------------------------------------- the worker side


@dataclass(frozen=True)
class ThisJob:
    """What a worker was handed: its parameters, its config (as checked by the parent) and where reports go."""

    folder: Path
    params: dict[str, Any]
    config: Config | None

    def report(self, global_rank: int, obj: dict[str, Any]) -> None:
        _write_json(self.folder / f"rank-{global_rank}.json", obj)


def this_job(argv: list[str]) -> ThisJob:
    """The job this worker belongs to, from `--job FOLDER` (what `run` started it with)."""
    parser = argparse.ArgumentParser(description="a worker of a lab job (lab.run.cluster.jobs)")
    parser.add_argument("--job", required=True, type=Path)
    folder = parser.parse_args(argv).job
    doc = _read_json(folder / JOB_FILE)
    config = from_dict(doc["config"], doc["origin"]) if doc["config"] is not None else None
    return ThisJob(folder, doc["params"], config)
