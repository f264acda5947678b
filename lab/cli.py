"""Command line: parse arguments, dispatch to a handler, turn errors into exit codes.

Exit codes: 0 ok; 1 a run failed (its traceback is printed); 2 bad input (one line
on stderr naming the file or argument, the key and what would be valid); 3 a
benchmark gate was missed (e.g. --min-busbw) or a deterministic rerun differed.
Every subcommand names its handler (`set_defaults(handler=...)`) and argument
ranges are argparse types, so a parsed Namespace is already a valid request.
torch is imported only by the handlers that need it, so bad input is refused fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

from lab import __version__
from lab import commands as handlers  # each subcommand's handler (lab.commands)
from lab.cluster import torchrun_env
from lab.errors import EXIT_BAD_INPUT, LabError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise LabError(f"{message} (see {self.prog} --help)")


def at_least(minimum: int, says: str = "{}") -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`; `says` words the value in the error.

    >>> at_least(1)("3")
    3
    >>> at_least(1, "{} images")("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 0 images; use 1 or more
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{says.format(value)}; use {minimum} or more")
        return value

    parse.__name__ = "integer"  # argparse names the type in its message: "invalid integer value"
    return parse


PROCESSES = at_least(1, "{} is not a process count")


def _module_run(module: str) -> Callable[[argparse.Namespace], int]:
    """A handler that imports `module` when called (torch with it) and runs its run(args)."""
    return lambda args: importlib.import_module(module).run(args)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", help="YAML config file, or a shipped name (smoke, baseline, ddp, "
                                                      "workshop-cpu, workshop-gpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key (repeatable), e.g. --set train.lr=0.1")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lab", description="A lab for PyTorch distributed data-parallel training.")
    parser.add_argument("--version", action="version", version=f"lab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for add in (_add_train, _add_rerun, _add_workshop, _add_launch, _add_bench, _add_pitfall, _add_memory,
                _add_choose, _add_report, _add_data, _add_doctor):
        add(commands)
    return parser


def _add_rerun(commands) -> None:
    rerun = commands.add_parser("rerun", help="train again from a run's manifest and compare the loss curves",
                                 description="Run RUN_DIR's recorded config, seed, data and world size again into "
                                             "a new run directory, then compare the loss curves step by step. "
                                             "Exit 3 when a deterministic run's curve is not bit-identical.")
    rerun.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with manifest.json and metrics.jsonl")
    rerun.add_argument("--steps", type=at_least(1), metavar="N", help="rerun and compare only the first N steps")
    rerun.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="change one config key for the rerun (repeatable), e.g. --set run.seed=1")
    rerun.add_argument("--output-dir", metavar="DIR", help="where the new run directory goes (default: beside RUN_DIR)")
    rerun.add_argument("--json", metavar="PATH", help="write the comparison as JSON")
    rerun.set_defaults(handler=_module_run("lab.training.rerun"))


def _add_train(commands) -> None:
    train = commands.add_parser("train", help="train ResNet-18 (DDP under torchrun)")
    _config_args(train)
    train.add_argument("--nproc-per-node", type=PROCESSES, metavar="N",
                       help="start torchrun with N processes on this node and print its command line")
    train.add_argument("--help-config", action="store_true", help="list every config key with its default")
    train.add_argument("--profile", action="store_true",
                       help="write a torch.profiler trace of 5 steps after warm-up "
                            "(same as --set train.profile_steps=5)")
    train.set_defaults(handler=handlers.train)


def _add_launch(commands) -> None:
    launch = commands.add_parser(
        "launch", help="start torchrun on this node (one node, or one of a multi-node c10d rendezvous)",
        description="Start torchrun on this node with the command line the lab builds, e.g. "
                    "`lab launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint head:29400 --rdzv-id r1 "
                    "-- -m lab train --config ddp`. What follows `--` is what every worker runs: a module "
                    "(-m ...) or a script and its arguments.")
    launch.add_argument("--nproc-per-node", type=PROCESSES, default=1, metavar="N", help="workers on this node")
    launch.add_argument("--nnodes", default="1", metavar="N|MIN:MAX", help="nodes in the job (MIN:MAX: elastic)")
    launch.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="the head node's c10d rendezvous (multi-node)")
    launch.add_argument("--rdzv-id", metavar="ID", help="one id for every node of the job (the run id)")
    launch.add_argument("--max-restarts", type=at_least(0), default=0, metavar="K",
                        help="restart the worker group up to K times after a failure")
    launch.add_argument("--join-timeout", type=int, metavar="SECONDS",
                        help="fail when not every node arrived within this time (torchrun's default: 600)")
    launch.add_argument("--local-addr", metavar="ADDR", help="this node's address, when it has several")
    launch.add_argument("--dry-run", action="store_true", help="print the torchrun command line and exit")
    launch.add_argument("target", nargs=argparse.REMAINDER, metavar="-- TARGET",
                        help="what every worker runs, e.g. -- -m lab train --config ddp")
    launch.set_defaults(handler=handlers.launch)


def _add_workshop(commands) -> None:
    workshop = commands.add_parser("workshop", help="baseline, then DDP with the same global batch, then compare")
    _config_args(workshop)
    workshop.add_argument("--nproc-per-node", type=PROCESSES, metavar="N",
                          help="DDP processes (default: 2 and 4 on a CPU; 2, 4, 8 ... up to the GPUs present)")
    workshop.add_argument("--output-dir", default="runs", metavar="DIR", help="where the workshop folder goes")
    workshop.add_argument("--only", metavar="PART[,PART]", help="run some parts: training, pitfalls, allreduce, "
                                                               "scaling, levers, memory, strategies (the report closes)")
    workshop.set_defaults(handler=handlers.workshop)


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench",
                                help="benchmarks: all-reduce and the other collectives, scaling, levers, data "
                                     "pipeline, metrics overhead, GPU check")
    benchmarks = bench.add_subparsers(dest="bench_command", required=True, parser_class=_Parser, metavar="NAME")
    for add in (_add_allreduce, _add_collective, _add_scaling, _add_strategies, _add_levers, _add_pipeline,
                _add_gpu_check, _add_overhead, _add_lightning):
        add(benchmarks)


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


def _add_allreduce(benchmarks) -> None:
    allreduce = benchmarks.add_parser("allreduce", help="all-reduce bus bandwidth with nccl-tests' columns")
    _nccl_tests_args(allreduce, "the reduction (default sum)", "sum")
    allreduce.add_argument("--pushgateway", metavar="HOST:PORT", help="push busbw per size to a Prometheus Pushgateway")
    allreduce.set_defaults(handler=handlers.allreduce)


def _add_collective(benchmarks) -> None:
    collective = benchmarks.add_parser(
        "collective", help="bus bandwidth of all_reduce, all_gather, reduce_scatter, broadcast, alltoall or "
                           "sendrecv with nccl-tests' columns",
        description="nccl-tests' table for one collective, a comma list or all of them, in one torchrun job: "
                    "size as nccl-tests defines it per op, algbw = size / time, busbw = algbw x 2(n-1)/n "
                    "(all_reduce), (n-1)/n (all_gather, reduce_scatter, alltoall) or 1 (broadcast, sendrecv). "
                    "With several ops, --json PATH writes PATH-OP.json per op. gloo has no reduce-scatter of its own: "
                    "there it runs as NCCL's ring over send/recv, and the table and JSON say so.")
    collective.add_argument("collectives", metavar="OP",
                            help="all_reduce, all_gather, reduce_scatter, broadcast, alltoall, sendrecv, a comma "
                                 "list of them, or all")
    _nccl_tests_args(collective, "the reduction of all_reduce and reduce_scatter (default sum)", None)
    collective.set_defaults(handler=handlers.collective)


def _add_scaling(benchmarks) -> None:
    scaling = benchmarks.add_parser("scaling", help="strong/weak scaling of the training step over 1..N processes")
    _config_args(scaling)
    scaling.add_argument("--mode", default="weak", choices=["weak", "strong"],
                         help="weak: batch per rank fixed; strong: global batch fixed (default weak)")
    scaling.add_argument("--max-world-size", type=at_least(1), metavar="N",
                         help="largest N (default: GPUs, else CPU cores)")
    scaling.add_argument("--batch-per-rank", type=at_least(1), help="weak mode: samples per rank (default 256 on GPUs, "
                                                            "where fewer leaves a GPU launch-bound; 64 on CPUs)")
    scaling.add_argument("--global-batch", type=at_least(1), help="strong mode: global batch (default 2048 on GPUs, as "
                                                          "the workshop-gpu config; 128 on CPUs)")
    scaling.add_argument("--steps", type=at_least(1), default=20, help="timed steps per world size (default 20)")
    scaling.add_argument("--warmup", type=at_least(0), default=5, help="warm-up steps per world size (default 5)")
    scaling.add_argument("--json", metavar="PATH", help="write the table as JSON")
    scaling.add_argument("--plot", metavar="PNG", help="write throughput and efficiency against N")
    scaling.add_argument("--pushgateway", metavar="HOST:PORT", help="push the table to a Prometheus Pushgateway")
    scaling.set_defaults(handler=_module_run("lab.bench.scaling"))


def _add_strategies(benchmarks) -> None:
    strategies = benchmarks.add_parser("strategies", help="DDP, FSDP and DeepSpeed ZeRO-1/2/3 side by side: memory per "
                                                          "rank, images/s, loss curves")
    _config_args(strategies)
    strategies.add_argument("--nproc-per-node", type=PROCESSES, metavar="N",
                            help="ranks per strategy (default: the GPUs present, else 2)")
    strategies.add_argument("--steps", type=at_least(2), default=6, help="training steps per strategy (default 6)")
    strategies.add_argument("--json", metavar="PATH", help="write the table as JSON")
    strategies.add_argument("--plot", metavar="PNG", help="memory per rank by strategy and the loss curves")
    strategies.set_defaults(handler=_module_run("lab.bench.strategies"))


def _add_levers(benchmarks) -> None:
    levers = benchmarks.add_parser(
        "levers", help="AMP, gradient accumulation, DDP buckets and NCCL settings as ratios to the plain step",
        description="One torchrun job times the plain DDP step and each lever (bf16/fp16 autocast, accumulation, "
                    "bucket size, gradients as bucket views) in interleaved blocks, each against its no_sync twin "
                    "for the communication share; checks accumulation is exact in float64; on GPUs also sweeps "
                    "NCCL_ALGO, NCCL_PROTO and NCCL_P2P_DISABLE with lab bench allreduce.")
    _config_args(levers)
    levers.add_argument("--nproc-per-node", type=PROCESSES, metavar="N",
                        help="ranks (default: the GPUs present, else 2)")
    levers.add_argument("--steps", type=at_least(1), default=4, help="optimizer steps per timed block (default 4)")
    levers.add_argument("--warmup", type=at_least(0), default=2, help="warm-up steps per variant (default 2)")
    levers.add_argument("--rounds", type=at_least(1), default=3,
                        help="rounds of one block per variant, the order reversed every other round (default 3)")
    levers.add_argument("--accum-steps", type=at_least(2), default=4, metavar="K",
                        help="micro-batches per optimizer step of the accumulation lever; must divide the batch per "
                             "rank (default 4)")
    levers.add_argument("--equivalence-steps", type=at_least(1), default=3,
                        help="float64 optimizer steps of the accumulation exactness check (default 3)")
    levers.add_argument("--json", metavar="PATH", help="write the tables as JSON")
    levers.add_argument("--plot", metavar="PNG", help="the levers' ratios to the plain step as bars")
    levers.set_defaults(handler=_module_run("lab.bench.levers"))


def _add_pipeline(benchmarks) -> None:
    pipeline = benchmarks.add_parser("pipeline", help="the lab's data path vs a torchvision DataLoader path")
    _config_args(pipeline)
    pipeline.add_argument("--batch-size", type=at_least(1), default=256,
                          help="images per batch for both paths (default 256)")
    pipeline.add_argument("--num-workers", type=at_least(0), default=2, help="DataLoader worker processes (default 2)")
    pipeline.add_argument("--batches", type=at_least(1), default=10, help="batches per timed block (default 10)")
    pipeline.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (default 3)")
    pipeline.add_argument("--settle-seconds", type=float, default=0.5,
                          help="pause before each block so DataLoader prefetching ends (default 0.5)")
    pipeline.add_argument("--json", metavar="PATH")
    pipeline.set_defaults(handler=_module_run("lab.bench.pipeline"))


def _add_gpu_check(benchmarks) -> None:
    gpu_check = benchmarks.add_parser("gpu-check", help="every GPU path of the lab on this host, a table last "
                                                            "(make gpu-check)")
    gpu_check.add_argument("--epochs", type=at_least(1), default=3, help="epochs of synthetic data to time (default 3)")
    gpu_check.add_argument("--out", default="runs/gpu-check", metavar="DIR",
                           help="step logs, runs and gpu-check.json (default runs/gpu-check)")
    gpu_check.add_argument("--json", metavar="PATH", help="also write the result here")
    gpu_check.add_argument("--skip-without-gpu", action="store_true",
                           help="without a GPU: say so, list the skipped steps and exit 0 (make gpu-check's dry check)")
    gpu_check.add_argument("--quick", action="store_true", help="toy sizes (to test the command itself)")
    gpu_check.add_argument("--allow-cpu", action="store_true", help="run without a GPU (with --quick, for tests)")
    gpu_check.add_argument("--deadline", type=at_least(1, "{} s"), default=360, metavar="SECONDS",
                           help="the whole check ends within this many seconds: each step gets what is left, the "
                                "steps after it are reported skipped (default 360)")
    gpu_check.set_defaults(handler=_module_run("lab.bench.gpu_check"))


def _add_overhead(benchmarks) -> None:
    overhead = benchmarks.add_parser("metrics-overhead", help="training step time with the exporter on vs off")
    _config_args(overhead)
    overhead.add_argument("--rounds", type=at_least(1), default=3, help="on/off block pairs (default 3)")
    overhead.add_argument("--steps", type=at_least(1), default=20, help="steps per block (default 20)")
    overhead.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    overhead.add_argument("--json", metavar="PATH")
    overhead.set_defaults(handler=_module_run("lab.bench.metrics_overhead"))


def _add_lightning(benchmarks) -> None:
    peer = benchmarks.add_parser(
        "lightning", help="the lab's images/s as a ratio to PyTorch Lightning's Trainer on the same model and data",
        description="`lab train` and Lightning's Trainer, one after the other under torchrun, train the config's "
                    "ResNet-18 on the same synthetic data, global batch, optimizer and precision; prints "
                    "lab / Lightning images/s over the steps after the warm-up. Needs pip install lightning==2.6.6.")
    _config_args(peer)
    peer.add_argument("--steps", type=at_least(2), default=40, help="training steps per side (default 40)")
    peer.add_argument("--warmup", type=at_least(1), metavar="N",
                      help="first steps left out of the timing on both sides (default 5, or half of --steps)")
    peer.add_argument("--nproc-per-node", type=PROCESSES, default=1, metavar="N", help="DDP processes (default 1)")
    peer.add_argument("--rounds", type=at_least(1), default=1,
                      help="runs per side, in ABBA order; the medians are compared (default 1)")
    peer.add_argument("--lightning-ddp", default="lab", choices=["lab", "default"],
                      help="Lightning's DDP settings: the lab's (bucket size, bucket views, buffer sync) or "
                           "Lightning's own (default lab)")
    peer.add_argument("--json", metavar="PATH", help="write the result and its settings as JSON")
    peer.set_defaults(handler=_module_run("lab.bench.lightning_peer"))


def _add_memory(commands) -> None:
    memory = commands.add_parser("memory", help="memory per device: DDP vs ZeRO-1/2/3 and FSDP")
    memory.add_argument("--params", type=float, default=7e9, help="parameter count (default 7e9)")
    # --world-size and --node-size: memory.run checks them, with messages that name what a device count means
    memory.add_argument("--world-size", type=int, default=8, help="devices (default 8)")
    memory.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd-momentum", "sgd"])
    memory.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"],
                        help="fp32, or bf16/fp16 mixed precision with fp32 master weights (default bf16)")
    memory.add_argument("--convention", default="zero", choices=["zero", "hf"],
                        help="bytes per parameter: zero (16 for mixed Adam) or hf (18) (default zero)")
    memory.add_argument("--node-size", type=int, help="devices per node, for FSDP hybrid shard")
    memory.add_argument("--device", choices=["h100", "h200", "a100-80", "a100-40"], help="device to fit on")
    memory.add_argument("--device-memory", type=float, metavar="GB", help="device memory in GB (instead of --device)")
    for name in ("seq-len", "micro-batch", "hidden", "heads", "layers"):
        memory.add_argument(f"--{name}", type=at_least(1), help="transformer activation term (give all five)")
    memory.add_argument("--measure", action="store_true", help="also measure ResNet-18: 1 process, DDP and FSDP")
    memory.add_argument("--measure-width", type=at_least(1), default=64,
                        help="ResNet-18 width for --measure (default 64)")
    memory.add_argument("--json", metavar="PATH")
    memory.add_argument("--plot", metavar="PNG", help="stacked bars of the estimate")
    memory.set_defaults(handler=_module_run("lab.sizing.memory"))


def _add_pitfall(commands) -> None:
    from lab.pitfalls import PITFALLS  # names and one-line summaries only: no torch at parse time

    pitfall = commands.add_parser("pitfall", help="the course's pitfalls: the mistake, then the fix, measured")
    pitfall.add_argument("name", nargs="?", choices=list(PITFALLS), metavar="NAME",
                         help="one of: " + ", ".join(PITFALLS) + " (none: list them)")
    pitfall.add_argument("--nproc-per-node", type=PROCESSES, metavar="N",
                         help="ranks (default: the GPUs present, else 2)")
    pitfall.add_argument("--json", metavar="PATH", help="write the broken and the fixed measurement as JSON")
    pitfall.set_defaults(handler=_module_run("lab.pitfalls.command"))


def _add_choose(commands) -> None:
    from lab.sizing import choose as tree  # no torch: its argparse types and tables only

    choose = commands.add_parser(
        "choose", help="which tool for this model: DDP, ZeRO-1/2, FSDP full/hybrid shard or offload",
        description="Walk the scaling lecture's decision tree with numbers and print the lab train line it ends on, "
                    "e.g. `lab choose --params 70B --nodes 2 --device h100 --interconnect ib-ndr`.")
    choose.add_argument("--params", type=tree.parse_params, required=True, metavar="COUNT",
                        help="parameter count: 7B, 70e9, 1.5T, 350M, 125e6")
    choose.add_argument("--gpus-per-node", type=PROCESSES, default=8, metavar="G", help="GPUs per node (default 8)")
    choose.add_argument("--nodes", type=at_least(1, "{} nodes"), default=1, metavar="N", help="nodes (default 1)")
    device = choose.add_mutually_exclusive_group()
    device.add_argument("--device", choices=sorted(tree.DEVICES_GB), help="GPU model (default h100)")
    device.add_argument("--gpu-memory", type=tree.GPU_MEMORY_GB, metavar="GB", help="GPU memory in GB (instead of "
                                                                                    "--device)")
    choose.add_argument("--interconnect", default="ib-ndr", choices=list(tree.INTERCONNECT_GBPS),
                        help="inter-node link, one NIC per GPU (default ib-ndr: 400 Gb/s)")
    choose.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd-momentum", "sgd"])
    choose.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"],
                        help="fp32, or bf16/fp16 mixed precision with fp32 master weights (default bf16)")
    for name, says in (("seq-len", "tokens per sequence"), ("hidden", "hidden size"), ("layers", "layers")):
        choose.add_argument(f"--{name}", type=at_least(1), help=f"{says}, for activations (give all three)")
    choose.add_argument("--micro-batch", type=at_least(1), default=1, help="sequences per GPU per step (default 1)")
    choose.add_argument("--heads", type=at_least(1), help="attention heads (default hidden/128)")
    choose.add_argument("--headroom", type=tree.FRACTION, default=tree.HEADROOM, metavar="FRACTION",
                        help="part of GPU memory kept free for the CUDA context, fragmentation, NCCL (default 0.1)")
    choose.add_argument("--json", metavar="PATH", help="write the decisions and the choice as JSON")
    choose.set_defaults(handler=_module_run("lab.sizing.choose"))


def _add_report(commands) -> None:
    report = commands.add_parser("report", help="report.md with plots from run directories and benchmark results")
    report.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories, workshop folders, result JSONs")
    report.add_argument("--out", metavar="DIR", help="where report.md and the PNGs go (default: the first folder)")
    report.set_defaults(handler=handlers.report)


def _add_doctor(commands) -> None:
    doctor = commands.add_parser("doctor", help="preflight checks of this host, one line each; exit 1 when one fails",
                                 description="Check python, torch, devices, NCCL/gloo, /dev/shm, ports, the run "
                                             "output directory and the interfaces NCCL/GLOO_SOCKET_IFNAME name.")
    doctor.add_argument("--port", action="append", default=[], metavar="PORT[-LAST]",
                        help="a port that must be free here: the rendezvous port, the metrics ports (repeatable)")
    doctor.add_argument("--output-dir", default="runs", metavar="DIR", help="run output directory (default: runs)")
    doctor.add_argument("--expect-gpus", type=at_least(0), metavar="N",
                        help="fail unless exactly N CUDA GPUs are visible")
    doctor.add_argument("--min-shm", type=float, default=1.0, metavar="GIB",
                        help="warn when /dev/shm is smaller (default 1 GiB)")
    doctor.add_argument("--json", metavar="PATH", help="write checks and facts as JSON ('-': stdout)")
    doctor.set_defaults(handler=handlers.doctor)


def _add_data(commands) -> None:
    data = commands.add_parser("data", help="prepare real CIFAR-10 or write synthetic data")
    data_commands = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser, metavar="ACTION")
    prepare = data_commands.add_parser("prepare", help="download and verify CIFAR-10 (needs internet or the archive)")
    prepare.add_argument("--root", default="data", help="data root (default: data)")
    prepare.set_defaults(handler=handlers.data_prepare)
    synth = data_commands.add_parser("synth", help="write synthetic CIFAR-shaped data in the CIFAR-10 layout")
    synth.add_argument("--root", default="data", help="data root (default: data)")
    synth.add_argument("--train-size", type=at_least(1, "{} images"), default=50000)
    synth.add_argument("--test-size", type=at_least(1, "{} images"), default=10000)
    synth.add_argument("--seed", type=at_least(0), default=0)
    synth.set_defaults(handler=handlers.data_synth)




def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.argv = argv
        args.parser = parser  # a handler that re-reads a worker's `lab ...` arguments parses them with this
        return args.handler(args)
    except LabError as exc:
        if torchrun_env.is_primary_process():  # under torchrun every rank sees the same bad input
            print(f"lab: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
