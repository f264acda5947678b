"""The benchmarks, one row each: the table `lab bench`'s parser reads (lab.measure.commands' `bench` group).

A row is a lab.command.Command: a benchmark's name (`lab bench NAME`, and the "benchmark" field of its result JSON),
its help, how its arguments are added to the command line and the function that runs it (below, importing its
module when called: torch comes with it). Adding a benchmark is its module and a row here. How a result is shown,
in `lab report` or as a part of `lab workshop`, is the course wing's (lab.course.teaching.sections,
lab.course.teaching.parts): a benchmark never knows it is part of a lesson. No torch at import: the CLI builds its
parser from this table.

>>> [b.name for b in BENCHMARKS.values()][:3]
['allreduce', 'collective', 'scaling']
"""

from __future__ import annotations

import argparse

from lab.command import Command
from lab.run.config.arguments import PROCESSES, at_least, config_args, host_port, output_file

Benchmark = Command  # a benchmark's row is a command's


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
    p.add_argument("--json", type=output_file, metavar="PATH", help="write rows and environment as JSON")
    p.add_argument("--min-busbw", type=float, metavar="GBPS", help="exit 3 when the average busbw is lower")
    p.add_argument("--link", help="reference link for the busbw ratio (nvlink4, ndr-ib, pcie5, ...)")
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N", help="start torchrun with N processes")
    # The worker side of --nproc-per-node: the parent judges --min-busbw from the JSON, so workers exit 0.
    p.add_argument("--gate-in-parent", action="store_true", help=argparse.SUPPRESS)


def _allreduce_args(p: argparse.ArgumentParser) -> None:
    _nccl_tests_args(p, "the reduction (default sum)", "sum")
    p.add_argument("--pushgateway", type=host_port, metavar="HOST:PORT", help="push busbw per size to a Pushgateway")


def _collective_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "collectives",
        metavar="OP",
        help="all_reduce, all_gather, reduce_scatter, broadcast, alltoall, sendrecv, a comma list of them, or all",
    )
    _nccl_tests_args(p, "the reduction of all_reduce and reduce_scatter (default sum)", None)


def _scaling_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--mode",
        default="weak",
        choices=["weak", "strong"],
        help="weak: batch per rank fixed; strong: global batch fixed (default weak)",
    )
    p.add_argument("--max-world-size", type=at_least(1), metavar="N", help="largest N (default: GPUs, else CPU cores)")
    p.add_argument(
        "--batch-per-rank",
        type=at_least(1),
        help="weak mode: samples per rank (default 256 on GPUs, where fewer leaves a GPU launch-bound; 64 on CPUs)",
    )
    p.add_argument(
        "--global-batch",
        type=at_least(1),
        help="strong mode: global batch (default 2048 on GPUs, as the workshop-gpu config; 128 on CPUs)",
    )
    p.add_argument("--steps", type=at_least(1), default=20, help="timed steps per world size (default 20)")
    p.add_argument("--warmup", type=at_least(0), default=5, help="warm-up steps per world size (default 5)")
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the table as JSON")
    p.add_argument("--plot", type=output_file, metavar="PNG", help="write throughput and efficiency against N")
    p.add_argument("--pushgateway", type=host_port, metavar="HOST:PORT", help="push the table to a Pushgateway")


def _strategies_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--nproc-per-node", type=PROCESSES, metavar="N", help="ranks per strategy (default: the GPUs present, else 2)"
    )
    p.add_argument("--steps", type=at_least(2), default=6, help="training steps per strategy (default 6)")
    p.add_argument(
        "--rows", metavar="LABELS", help="only these rows, comma-separated (e.g. DDP,Horovod; default: every row)"
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the table as JSON")
    p.add_argument("--plot", type=output_file, metavar="PNG", help="memory per rank by strategy and the loss curves")


def _levers_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N", help="ranks (default: the GPUs present, else 2)")
    p.add_argument("--steps", type=at_least(1), default=4, help="optimizer steps per timed block (default 4)")
    p.add_argument("--warmup", type=at_least(0), default=2, help="warm-up steps per variant (default 2)")
    p.add_argument(
        "--rounds",
        type=at_least(1),
        default=3,
        help="rounds of one block per variant, the order reversed every other round (default 3)",
    )
    p.add_argument(
        "--accum-steps",
        type=at_least(2),
        default=4,
        metavar="K",
        help="micro-batches per optimizer step of the accumulation lever; must divide the batch per rank (default 4)",
    )
    p.add_argument(
        "--equivalence-steps",
        type=at_least(1),
        default=3,
        help="float64 optimizer steps of the accumulation exactness check (default 3)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the tables as JSON")
    p.add_argument("--plot", type=output_file, metavar="PNG", help="the levers' ratios to the plain step as bars")


def _pipeline_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--batch-size", type=at_least(1), default=256, help="images per batch for both paths (default 256)")
    p.add_argument("--num-workers", type=at_least(0), default=2, help="DataLoader worker processes (default 2)")
    p.add_argument("--batches", type=at_least(1), default=10, help="batches per timed block (default 10)")
    p.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=0.5,
        help="pause before each block so DataLoader prefetching ends (default 0.5)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH")


def _hostdevice_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", default="256M", help="bytes per copy, K/M/G binary as in nccl-tests (default 256M)")
    p.add_argument("--iters", type=at_least(1), default=20, help="timed copies per figure (default 20)")
    p.add_argument(
        "--json",
        type=output_file,
        metavar="PATH",
        help="write the figures as JSON (the schema: lab/measure/bench/comm/hostdevice.py)",
    )


def _metrics_overhead_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--rounds", type=at_least(1), default=3, help="on/off block pairs (default 3)")
    p.add_argument("--steps", type=at_least(1), default=20, help="steps per block (default 20)")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    p.add_argument("--json", type=output_file, metavar="PATH")


def _hang_record_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N", help="ranks of each job (default 2)")
    p.add_argument("--rounds", type=at_least(1), default=2, help="on/off job pairs, ABBA (default 2)")
    p.add_argument("--steps", type=at_least(1), default=20, help="timed training steps a job (default 20)")
    p.add_argument("--calls", type=at_least(1), default=500, help="timed 4-byte all-reduces a job (default 500)")
    p.add_argument("--json", type=output_file, metavar="PATH")


def _lightning_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--steps", type=at_least(2), default=40, help="training steps per side (default 40)")
    p.add_argument(
        "--warmup",
        type=at_least(1),
        metavar="N",
        help="first steps left out of the timing on both sides (default 5, or half of --steps)",
    )
    p.add_argument("--nproc-per-node", type=PROCESSES, default=1, metavar="N", help="DDP processes (default 1)")
    p.add_argument(
        "--rounds",
        type=at_least(1),
        default=1,
        help="runs per side, in ABBA order; the medians are compared (default 1)",
    )
    p.add_argument(
        "--lightning-ddp",
        default="lab",
        choices=["lab", "default"],
        help="Lightning's DDP settings: the lab's (bucket size, bucket views, buffer sync) or "
        "Lightning's own (default lab)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the result and its settings as JSON")


# ----------------------------------------------------------------------------- each benchmark's run (imported when
# called: torch comes with it)


def _run_allreduce(args: argparse.Namespace) -> int:
    from lab.measure.bench.comm import relaunch

    return relaunch.allreduce(args)


def _run_collective(args: argparse.Namespace) -> int:
    from lab.measure.bench.comm import relaunch

    return relaunch.collective(args)


def _run_scaling(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import scaling

    return scaling.run(args)


def _run_levers(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import levers

    return levers.run(args)


def _run_strategies(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import strategies

    return strategies.run(args)


def _run_pipeline(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import pipeline

    return pipeline.run(args)


def _run_hostdevice(args: argparse.Namespace) -> int:
    from lab.measure.bench.comm import hostdevice

    return hostdevice.run(args)


def _run_metrics_overhead(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import metrics_overhead

    return metrics_overhead.run(args)


def _run_hang_record(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import hang_record

    return hang_record.run(args)


def _run_lightning_peer(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import lightning_peer

    return lightning_peer.run(args)


# ----------------------------------------------------------------------------- the table

# `lab bench`'s subcommands in the course's order. allreduce and collective run through lab.measure.bench.comm.relaunch,
# which starts torchrun for --nproc-per-node before a rank's own run. The device check, once `lab bench gpu-check`, is
# `lab gpu-check` (lab.machine.commands); lab.cli keeps the old name as an alias that says so.
BENCHMARKS: dict[str, Command] = {
    b.name: b
    for b in (
        Benchmark(
            "allreduce",
            "all-reduce bus bandwidth with nccl-tests' columns",
            _allreduce_args,
            _run_allreduce,
        ),
        Benchmark(
            "collective",
            "bus bandwidth of all_reduce, all_gather, reduce_scatter, broadcast, alltoall or "
            "sendrecv with nccl-tests' columns",
            _collective_args,
            _run_collective,
            description="nccl-tests' table for one collective, a comma list or all of them, in one torchrun job: "
            "size as nccl-tests defines it per op, algbw = size / time, busbw = algbw x 2(n-1)/n "
            "(all_reduce), (n-1)/n (all_gather, reduce_scatter, alltoall) or 1 (broadcast, sendrecv). "
            "With several ops, --json PATH writes PATH-OP.json per op. gloo has no reduce-scatter of "
            "its own: there it runs as NCCL's ring over send/recv, and the table and JSON say so.",
        ),
        Benchmark(
            "scaling",
            "strong/weak scaling of the training step over 1..N processes",
            _scaling_args,
            _run_scaling,
        ),
        Benchmark(
            "levers",
            "AMP, gradient accumulation, DDP buckets and NCCL settings as ratios to the plain step",
            _levers_args,
            _run_levers,
            description="One torchrun job times the plain DDP step and each lever (bf16/fp16 autocast, "
            "accumulation, bucket size, gradients as bucket views) in interleaved blocks, each against "
            "its no_sync twin for the communication share; checks accumulation is exact in float64; on "
            "GPUs also sweeps NCCL_ALGO, NCCL_PROTO and NCCL_P2P_DISABLE with lab bench allreduce.",
        ),
        Benchmark(
            "strategies",
            "DDP, FSDP, DeepSpeed ZeRO-1/2/3 and Horovod side by side: memory per rank, images/s, loss curves",
            _strategies_args,
            _run_strategies,
        ),
        Benchmark(
            "pipeline",
            "the lab's data path vs a torchvision DataLoader path",
            _pipeline_args,
            _run_pipeline,
        ),
        Benchmark(
            "hostdevice",
            "pinned host<->device copy bandwidth per GPU and the GPU-to-GPU copy matrix",
            _hostdevice_args,
            _run_hostdevice,
            description="Per visible GPU, pinned host memory to the GPU and back; for every pair of GPUs a copy "
            "from one to the other (the diagonal: within one GPU), GB/s = 1e9 B/s, torch copies timed "
            'after warm-ups. Without CUDA the CPU stands in (host memory copies, "device": "cpu").',
        ),
        Benchmark(
            "metrics-overhead",
            "training step time with the exporter on vs off",
            _metrics_overhead_args,
            _run_metrics_overhead,
        ),
        Benchmark(
            "hang-record",
            "what recording every collective costs (Flight Recorder, watchdog): on vs off",
            _hang_record_args,
            _run_hang_record,
            description="Alternate torchrun jobs (ABBA) with each rank's collective record and watchdog on and "
            "off (LAB_FLIGHT_RECORDER=0, dist.hang_seconds=0); print a training step's and a 4-byte all-reduce's "
            "time on / off. Goal: a step at most 1%% slower (docs/reliability.md).",
        ),
        Benchmark(
            "lightning",
            "the lab's images/s as a ratio to PyTorch Lightning's Trainer on the same model and data",
            _lightning_args,
            _run_lightning_peer,
            description="`lab train` and Lightning's Trainer, one after the other under torchrun, train the "
            "config's ResNet-18 on the same synthetic data, global batch, optimizer and precision; "
            "prints lab / Lightning images/s over the steps after the warm-up. Needs pip install "
            "lightning==2.6.6.",
        ),
    )
}
