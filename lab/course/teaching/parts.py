"""The benchmarks' parts of `lab workshop`: which benchmarks the workshop runs, in the course's order, and how each
is sized on this host. A benchmark never knows it is part of a lesson; the workshop decides here.

A part is a function of the host (its GPUs, the benchmarks' rank count, the config, the results folder) that
returns the steps to run, each a `lab` command line that writes its JSON into the folder, where `lab report`
finds it (lab.course.teaching.sections).

>>> host = WorkshopHost(0, 2, "workshop-cpu", [], Path("/tmp/w"))
>>> [(s.title, s.processes) for s in PARTS["levers"](host)]
[('levers over 2 ranks: precision, accumulation, DDP buckets, NCCL', 2)]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from lab.run.cluster import launch


@dataclass(frozen=True)
class WorkshopHost:
    """What a benchmark's part of `lab workshop` is sized from: the host, the config, where results go."""

    gpus: int  # 0 on a CPU host
    ranks: int  # the benchmarks' process count on this host
    config_name: str
    set_args: list[str]  # the workshop's overrides as --set pairs
    folder: Path  # the workshop's results folder: each part writes its JSON there

    @property
    def lab(self) -> list[str]:
        return [sys.executable, "-m", "lab"]


class WorkshopStep(NamedTuple):
    title: str
    processes: int  # on this host, for the threads each gets
    command: list[str]


def allreduce(host: WorkshopHost) -> list[WorkshopStep]:
    """The all-reduce table over the benchmarks' ranks, to 1 GiB on GPUs, 64 MiB on a CPU."""
    on_gpu = host.gpus > 0
    return [
        WorkshopStep(
            f"all-reduce bus bandwidth over {host.ranks} ranks",
            host.ranks,
            launch.torchrun_command(
                host.ranks,
                [
                    "-m",
                    "lab",
                    "bench",
                    "allreduce",
                    "-b",
                    "8",
                    "-e",
                    "1G" if on_gpu else "64M",
                    "-n",
                    "20" if on_gpu else "10",
                    "-w",
                    "5" if on_gpu else "2",
                    "--json",
                    str(host.folder / "allreduce.json"),
                ],
            ),
        )
    ]


def scaling(host: WorkshopHost) -> list[WorkshopStep]:
    """Strong then weak scaling over 1, 2, 4 processes on a CPU (4 is past 2 cores: the table says so and the fit
    leaves it out) and over every GPU on a GPU server; each process gets the threads of the largest run at every
    size."""
    on_gpu = host.gpus > 0
    largest = host.gpus if on_gpu else max(4, host.ranks)
    return [
        WorkshopStep(
            f"{title} over 1..{largest} processes",
            largest,
            [
                *host.lab,
                "bench",
                "scaling",
                "--config",
                host.config_name,
                *host.set_args,
                "--mode",
                mode,
                "--max-world-size",
                str(largest),
                "--steps",
                "40" if on_gpu else "4",
                "--warmup",
                "10" if on_gpu else "1",
                "--json",
                str(host.folder / f"scaling-{mode}.json"),
            ],
        )
        for mode, title in (
            ("strong", "strong scaling (one global batch) with Amdahl's law"),
            ("weak", "weak scaling (one batch per process) with Gustafson's law"),
        )
    ]


def levers(host: WorkshopHost) -> list[WorkshopStep]:
    """Every lever over the benchmarks' ranks, 2 rounds."""
    return [
        WorkshopStep(
            f"levers over {host.ranks} ranks: precision, accumulation, DDP buckets, NCCL",
            host.ranks,
            [
                *host.lab,
                "bench",
                "levers",
                "--config",
                host.config_name,
                *host.set_args,
                "--nproc-per-node",
                str(host.ranks),
                "--steps",
                "10" if host.gpus else "2",
                "--rounds",
                "2",
                "--warmup",
                "1",
                "--json",
                str(host.folder / "levers.json"),
            ],
        )
    ]


def memory(host: WorkshopHost) -> list[WorkshopStep]:
    """`lab memory` (a command of lab.measure.sizing, not a benchmark): a 7B model over 8 of this host's GPUs (an H100
    unless it has H200s), and ResNet-18 measured."""
    device = "h200" if host.gpus and "H200" in _device_name() else "h100"
    return [
        WorkshopStep(
            "memory: a 7B model under DDP vs ZeRO/FSDP, and ResNet-18 measured",
            1,
            [
                *host.lab,
                "memory",
                "--params",
                "7e9",
                "--world-size",
                "8",
                "--device",
                device,
                "--measure",
                "--json",
                str(host.folder / "memory.json"),
            ],
        )
    ]


def strategies(host: WorkshopHost) -> list[WorkshopStep]:
    """Every strategy row over the benchmarks' ranks."""
    from lab.measure.bench.train.strategies import strategy_rows

    names = ", ".join(label for label, *_ in strategy_rows())
    return [
        WorkshopStep(
            f"strategies: {names} over {host.ranks} ranks",
            host.ranks,
            [
                *host.lab,
                "bench",
                "strategies",
                "--config",
                host.config_name,
                *host.set_args,
                "--nproc-per-node",
                str(host.ranks),
                "--steps",
                "20" if host.gpus else "6",
                "--json",
                str(host.folder / "strategies.json"),
            ],
        )
    ]


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


# In the course's order, after the workshop's own parts (training, pitfalls).
PARTS: dict[str, Callable[[WorkshopHost], list[WorkshopStep]]] = {
    "allreduce": allreduce,
    "scaling": scaling,
    "levers": levers,
    "memory": memory,
    "strategies": strategies,
}
