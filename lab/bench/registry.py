"""The benchmarks, one row each: the table `lab bench`'s parser, `lab report` and the workshop read.

A row holds a benchmark's name (`lab bench NAME`, and the "benchmark" field of its result JSON), its help, how its
arguments are added to the command line, what runs it (a "module.function" taking the parsed arguments, imported
when called: torch comes with it), and its section of `lab report` (a "module.function" that draws its figure with
lab.plots and returns the Markdown, given its results and the report's folder). Adding a benchmark is its module
and a row here. No torch at import: the CLI builds its parser from this table.

>>> [b.name for b in BENCHMARKS.values() if b.section][:3], result_key({"benchmark": "scaling", "mode": "strong"})
(['allreduce', 'collective', 'scaling'], 'scaling-strong')
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lab.config.arguments import PROCESSES, at_least, config_args


@dataclass(frozen=True)
class Benchmark:
    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None] | None  # None: not a `lab bench` command (lab memory)
    run: str | None                     # "module.function" called with the parsed arguments
    description: str | None = None      # --help's text, when more than `help`
    section: str | None = None          # "module.function": (results, out folder) -> its Markdown in lab report
    part: Callable[[dict[str, Any]], str] | None = None  # a result that is one of several: which (scaling's mode)
    workshop: str | None = None         # "module.function": (a WorkshopHost) -> its [WorkshopStep] in lab workshop


@dataclass(frozen=True)
class WorkshopHost:
    """What a benchmark's part of `lab workshop` is sized from: the host, the config, where results go."""
    gpus: int                           # 0 on a CPU host
    ranks: int                          # the benchmarks' process count on this host
    config_name: str
    set_args: list[str]                 # the workshop's overrides as --set pairs
    folder: Path                        # the workshop's results folder: each part writes its JSON there

    @property
    def lab(self) -> list[str]:
        return [sys.executable, "-m", "lab"]


class WorkshopStep(NamedTuple):
    title: str
    processes: int                      # on this host, for the threads each gets
    command: list[str]


def memory_workshop_steps(host: WorkshopHost) -> list[WorkshopStep]:
    """lab workshop's memory part (lab memory is a command of its own, below the benchmarks: lab.sizing): a 7B
    model over 8 of this host's GPUs (an H100 unless it has H200s), and ResNet-18 measured."""
    device = "h200" if host.gpus and "H200" in _device_name() else "h100"
    return [WorkshopStep("memory: a 7B model under DDP vs ZeRO/FSDP, and ResNet-18 measured", 1, [
        *host.lab, "memory", "--params", "7e9", "--world-size", "8", "--device", device, "--measure",
        "--json", str(host.folder / "memory.json")])]


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def workshop_parts() -> list[Benchmark]:
    """The benchmarks that are parts of `lab workshop`, in the course's order."""
    return [b for b in BENCHMARKS.values() if b.workshop]


def call(path: str, *args: Any) -> Any:
    """Import "module.function" now and call it."""
    module, _, function = path.rpartition(".")
    return getattr(importlib.import_module(module), function)(*args)


def result_key(doc: dict[str, Any]) -> str | None:
    """The key a benchmark's result files under in the report (one per file the report keeps), None when no row
    with a section made it."""
    row = BENCHMARKS.get(doc.get("benchmark"))  # type: ignore[arg-type]
    if row is None or row.section is None:
        return None
    return f"{row.name}-{row.part(doc)}" if row.part else row.name


# ----------------------------------------------------------------------------- each benchmark's arguments


def _nccl_tests_args(p: argparse.ArgumentParser, op_help: str, op_default: str | None) -> None:
    """The options `lab bench allreduce` and `lab bench collective` share: nccl-tests' -b -e -f -n -w, the type,
    the reduction, JSON, the gate, the reference link and --nproc-per-node."""
    p.add_argument("-b", "--minbytes", default="8", help="smallest size, bytes with K/M/G (default 8)")
    p.add_argument("-e", "--maxbytes", default="256M", help="largest size (default 256M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size multiplication factor (default 2)")
    p.add_argument("-n", "--iters", type=at_least(1), default=20, help="timed iterations per size (default 20)")
    p.add_argument("-w", "--warmup-iters", type=at_least(0), default=5, help="warm-up iterations (default 5)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--op", default=op_default, choices=["sum", "avg", "max"], help=op_help)
    p.add_argument("--json", metavar="PATH", help="write rows and environment as JSON")
    p.add_argument("--min-busbw", type=float, metavar="GBPS", help="exit 3 when the average busbw is lower")
    p.add_argument("--link", help="reference link for the busbw ratio (nvlink4, ndr-ib, pcie5, ...)")
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N", help="start torchrun with N processes")
    # The worker side of --nproc-per-node: the parent judges --min-busbw from the JSON, so workers exit 0.
    p.add_argument("--gate-in-parent", action="store_true", help=argparse.SUPPRESS)


def _allreduce_args(p: argparse.ArgumentParser) -> None:
    _nccl_tests_args(p, "the reduction (default sum)", "sum")
    p.add_argument("--pushgateway", metavar="HOST:PORT", help="push busbw per size to a Prometheus Pushgateway")


def _collective_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("collectives", metavar="OP", help="all_reduce, all_gather, reduce_scatter, broadcast, alltoall, "
                                                     "sendrecv, a comma list of them, or all")
    _nccl_tests_args(p, "the reduction of all_reduce and reduce_scatter (default sum)", None)


def _scaling_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--mode", default="weak", choices=["weak", "strong"],
                   help="weak: batch per rank fixed; strong: global batch fixed (default weak)")
    p.add_argument("--max-world-size", type=at_least(1), metavar="N", help="largest N (default: GPUs, else CPU cores)")
    p.add_argument("--batch-per-rank", type=at_least(1), help="weak mode: samples per rank (default 256 on GPUs, "
                                                              "where fewer leaves a GPU launch-bound; 64 on CPUs)")
    p.add_argument("--global-batch", type=at_least(1), help="strong mode: global batch (default 2048 on GPUs, as "
                                                            "the workshop-gpu config; 128 on CPUs)")
    p.add_argument("--steps", type=at_least(1), default=20, help="timed steps per world size (default 20)")
    p.add_argument("--warmup", type=at_least(0), default=5, help="warm-up steps per world size (default 5)")
    p.add_argument("--json", metavar="PATH", help="write the table as JSON")
    p.add_argument("--plot", metavar="PNG", help="write throughput and efficiency against N")
    p.add_argument("--pushgateway", metavar="HOST:PORT", help="push the table to a Prometheus Pushgateway")


def _strategies_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N",
                   help="ranks per strategy (default: the GPUs present, else 2)")
    p.add_argument("--steps", type=at_least(2), default=6, help="training steps per strategy (default 6)")
    p.add_argument("--rows", metavar="LABELS", help="only these rows, comma-separated (e.g. DDP,Horovod; "
                                                    "default: every row)")
    p.add_argument("--json", metavar="PATH", help="write the table as JSON")
    p.add_argument("--plot", metavar="PNG", help="memory per rank by strategy and the loss curves")


def _levers_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N", help="ranks (default: the GPUs present, else 2)")
    p.add_argument("--steps", type=at_least(1), default=4, help="optimizer steps per timed block (default 4)")
    p.add_argument("--warmup", type=at_least(0), default=2, help="warm-up steps per variant (default 2)")
    p.add_argument("--rounds", type=at_least(1), default=3,
                   help="rounds of one block per variant, the order reversed every other round (default 3)")
    p.add_argument("--accum-steps", type=at_least(2), default=4, metavar="K",
                   help="micro-batches per optimizer step of the accumulation lever; must divide the batch per "
                        "rank (default 4)")
    p.add_argument("--equivalence-steps", type=at_least(1), default=3,
                   help="float64 optimizer steps of the accumulation exactness check (default 3)")
    p.add_argument("--json", metavar="PATH", help="write the tables as JSON")
    p.add_argument("--plot", metavar="PNG", help="the levers' ratios to the plain step as bars")


def _pipeline_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--batch-size", type=at_least(1), default=256, help="images per batch for both paths (default 256)")
    p.add_argument("--num-workers", type=at_least(0), default=2, help="DataLoader worker processes (default 2)")
    p.add_argument("--batches", type=at_least(1), default=10, help="batches per timed block (default 10)")
    p.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (default 3)")
    p.add_argument("--settle-seconds", type=float, default=0.5,
                   help="pause before each block so DataLoader prefetching ends (default 0.5)")
    p.add_argument("--json", metavar="PATH")


def _hostdevice_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default="256M", help="bytes per copy, K/M/G binary as in nccl-tests (default 256M)")
    p.add_argument("--iters", type=at_least(1), default=20, help="timed copies per figure (default 20)")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON (the schema: lab/bench/hostdevice.py)")


def _gpu_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=at_least(1), default=3, help="epochs of synthetic data to time (default 3)")
    p.add_argument("--out", default="runs/gpu-check", metavar="DIR",
                   help="step logs, runs and gpu-check.json (default runs/gpu-check)")
    p.add_argument("--json", metavar="PATH", help="also write the result here")
    p.add_argument("--skip-without-gpu", action="store_true",
                   help="without a GPU: say so, list the skipped steps and exit 0 (make gpu-check's dry check)")
    p.add_argument("--quick", action="store_true", help="toy sizes (to test the command itself)")
    p.add_argument("--allow-cpu", action="store_true", help="run without a GPU (with --quick, for tests)")
    p.add_argument("--deadline", type=at_least(1, "{} s"), default=360, metavar="SECONDS",
                   help="the whole check ends within this many seconds: each step gets what is left, the "
                        "steps after it are reported skipped (default 360)")


def _metrics_overhead_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--rounds", type=at_least(1), default=3, help="on/off block pairs (default 3)")
    p.add_argument("--steps", type=at_least(1), default=20, help="steps per block (default 20)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    p.add_argument("--json", metavar="PATH")


def _lightning_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--steps", type=at_least(2), default=40, help="training steps per side (default 40)")
    p.add_argument("--warmup", type=at_least(1), metavar="N",
                   help="first steps left out of the timing on both sides (default 5, or half of --steps)")
    p.add_argument("--nproc-per-node", type=PROCESSES, default=1, metavar="N", help="DDP processes (default 1)")
    p.add_argument("--rounds", type=at_least(1), default=1,
                   help="runs per side, in ABBA order; the medians are compared (default 1)")
    p.add_argument("--lightning-ddp", default="lab", choices=["lab", "default"],
                   help="Lightning's DDP settings: the lab's (bucket size, bucket views, buffer sync) or "
                        "Lightning's own (default lab)")
    p.add_argument("--json", metavar="PATH", help="write the result and its settings as JSON")


# ----------------------------------------------------------------------------- the table

# In the course's order: the report's sections and the workshop's parts follow it. allreduce and collective run
# through lab.bench.relaunch, which starts torchrun for --nproc-per-node before a rank's own run.
BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("allreduce", "all-reduce bus bandwidth with nccl-tests' columns", _allreduce_args,
              "lab.bench.relaunch.allreduce", section="lab.bench.sections.allreduce",
              workshop="lab.bench.allreduce.workshop_steps"),
    Benchmark("collective", "bus bandwidth of all_reduce, all_gather, reduce_scatter, broadcast, alltoall or "
                            "sendrecv with nccl-tests' columns", _collective_args, "lab.bench.relaunch.collective",
              description="nccl-tests' table for one collective, a comma list or all of them, in one torchrun job: "
                          "size as nccl-tests defines it per op, algbw = size / time, busbw = algbw x 2(n-1)/n "
                          "(all_reduce), (n-1)/n (all_gather, reduce_scatter, alltoall) or 1 (broadcast, sendrecv). "
                          "With several ops, --json PATH writes PATH-OP.json per op. gloo has no reduce-scatter of "
                          "its own: there it runs as NCCL's ring over send/recv, and the table and JSON say so.",
              section="lab.bench.sections.collectives", part=lambda doc: str(doc.get("collective"))),
    Benchmark("scaling", "strong/weak scaling of the training step over 1..N processes", _scaling_args,
              "lab.bench.scaling.run", section="lab.bench.sections.scaling", workshop="lab.bench.scaling.workshop_steps",
              part=lambda doc: str(doc.get("mode", "weak"))),
    Benchmark("levers", "AMP, gradient accumulation, DDP buckets and NCCL settings as ratios to the plain step",
              _levers_args, "lab.bench.levers.run",
              description="One torchrun job times the plain DDP step and each lever (bf16/fp16 autocast, "
                          "accumulation, bucket size, gradients as bucket views) in interleaved blocks, each against "
                          "its no_sync twin for the communication share; checks accumulation is exact in float64; on "
                          "GPUs also sweeps NCCL_ALGO, NCCL_PROTO and NCCL_P2P_DISABLE with lab bench allreduce.",
              section="lab.bench.sections.levers", workshop="lab.bench.levers.workshop_steps"),
    # `lab memory` is a command of its own (lab.cli); its result is a section of the report like a benchmark's.
    Benchmark("memory", "memory per device: DDP vs ZeRO-1/2/3 and FSDP", None, None,
              section="lab.bench.sections.memory", workshop="lab.bench.registry.memory_workshop_steps"),
    Benchmark("strategies", "DDP, FSDP, DeepSpeed ZeRO-1/2/3 and Horovod side by side: memory per rank, images/s, "
                            "loss curves", _strategies_args, "lab.bench.strategies.run",
              section="lab.bench.sections.strategies", workshop="lab.bench.strategies.workshop_steps"),
    Benchmark("pipeline", "the lab's data path vs a torchvision DataLoader path", _pipeline_args,
              "lab.bench.pipeline.run"),
    Benchmark("hostdevice", "pinned host<->device copy bandwidth per GPU and the GPU-to-GPU copy matrix",
              _hostdevice_args, "lab.bench.hostdevice.run",
              description="Per visible GPU, pinned host memory to the GPU and back; for every pair of GPUs a copy "
                          "from one to the other (the diagonal: within one GPU), GB/s = 1e9 B/s, torch copies timed "
                          "after warm-ups. Without CUDA the CPU stands in (host memory copies, \"device\": \"cpu\")."),
    Benchmark("gpu-check", "every GPU path of the lab on this host, a table last (make gpu-check)", _gpu_check_args,
              "lab.bench.gpu_check.run"),
    Benchmark("metrics-overhead", "training step time with the exporter on vs off", _metrics_overhead_args,
              "lab.bench.metrics_overhead.run"),
    Benchmark("lightning", "the lab's images/s as a ratio to PyTorch Lightning's Trainer on the same model and data",
              _lightning_args, "lab.bench.lightning_peer.run",
              description="`lab train` and Lightning's Trainer, one after the other under torchrun, train the "
                          "config's ResNet-18 on the same synthetic data, global batch, optimizer and precision; "
                          "prints lab / Lightning images/s over the steps after the warm-up. Needs pip install "
                          "lightning==2.6.6."),
)}
