"""Command line: parse arguments, dispatch, and turn errors into exit codes.

Exit codes: 0 ok; 1 a run failed (its traceback is printed); 2 bad input (one line
on stderr naming the file or argument, the key and what would be valid); 3 a
benchmark gate was missed (e.g. --min-busbw).
torch is imported only by the commands that need it, so bad input is refused fast.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from lab import __version__, torchrun_env
from lab.errors import LabError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_GATE_MISSED = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise LabError(f"{message} (see {self.prog} --help)")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", help="YAML config file, or a shipped name (smoke, baseline, ddp, "
                                                      "workshop-cpu, workshop-gpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key (repeatable), e.g. --set train.lr=0.1")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lab", description="A lab for PyTorch distributed data-parallel training.")
    parser.add_argument("--version", action="version", version=f"lab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    for add in (_add_train, _add_workshop, _add_launch, _add_bench, _add_memory, _add_report, _add_data,
                _add_doctor):
        add(commands)
    return parser


def _add_train(commands) -> None:
    train = commands.add_parser("train", help="train ResNet-18 (DDP under torchrun)")
    _config_args(train)
    train.add_argument("--nproc-per-node", type=int, metavar="N",
                       help="start torchrun with N processes on this node and print its command line")
    train.add_argument("--help-config", action="store_true", help="list every config key with its default")
    train.add_argument("--profile", action="store_true",
                       help="write a torch.profiler trace of 5 steps after warm-up (same as --set train.profile_steps=5)")


def _add_launch(commands) -> None:
    launch = commands.add_parser(
        "launch", help="start torchrun on this node (one node, or one of a multi-node c10d rendezvous)",
        description="Start torchrun on this node with the command line the lab builds, e.g. "
                    "`lab launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint head:29400 --rdzv-id r1 "
                    "-- -m lab train --config ddp`. What follows `--` is what every worker runs: a module "
                    "(-m ...) or a script and its arguments.")
    launch.add_argument("--nproc-per-node", type=int, default=1, metavar="N", help="workers on this node")
    launch.add_argument("--nnodes", default="1", metavar="N|MIN:MAX", help="nodes in the job (MIN:MAX: elastic)")
    launch.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="the head node's c10d rendezvous (multi-node)")
    launch.add_argument("--rdzv-id", metavar="ID", help="one id for every node of the job (the run id)")
    launch.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart the worker group up to K times after a failure")
    launch.add_argument("--join-timeout", type=int, metavar="SECONDS",
                        help="fail when not every node arrived within this time (torchrun's default: 600)")
    launch.add_argument("--local-addr", metavar="ADDR", help="this node's address, when it has several")
    launch.add_argument("--dry-run", action="store_true", help="print the torchrun command line and exit")
    launch.add_argument("target", nargs=argparse.REMAINDER, metavar="-- TARGET",
                        help="what every worker runs, e.g. -- -m lab train --config ddp")


def _add_workshop(commands) -> None:
    workshop = commands.add_parser("workshop", help="baseline, then DDP with the same global batch, then compare")
    _config_args(workshop)
    workshop.add_argument("--nproc-per-node", type=int, metavar="N",
                          help="DDP processes (default: 2 on a CPU; 2, 4, 8 ... up to the GPUs present)")
    workshop.add_argument("--output-dir", default="runs", metavar="DIR", help="where the workshop folder goes")


def _add_bench(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks: all-reduce, scaling, data pipeline, metrics overhead, GPU check")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, parser_class=_Parser, metavar="NAME")
    allreduce = bench_commands.add_parser("allreduce", help="all-reduce bus bandwidth with nccl-tests' columns")
    allreduce.add_argument("-b", "--minbytes", default="8", help="smallest size, bytes with K/M/G (default 8)")
    allreduce.add_argument("-e", "--maxbytes", default="256M", help="largest size (default 256M)")
    allreduce.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size multiplication factor (default 2)")
    allreduce.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    allreduce.add_argument("-w", "--warmup-iters", type=int, default=5, help="warm-up iterations (default 5)")
    allreduce.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    allreduce.add_argument("--op", default="sum", choices=["sum", "avg", "max"])
    allreduce.add_argument("--json", metavar="PATH", help="write rows and environment as JSON")
    allreduce.add_argument("--min-busbw", type=float, metavar="GBPS", help="exit 3 when the average busbw is lower")
    allreduce.add_argument("--link", help="reference link for the busbw ratio (nvlink4, ndr-ib, pcie5, ...)")
    allreduce.add_argument("--nproc-per-node", type=int, metavar="N", help="start torchrun with N processes")
    allreduce.add_argument("--pushgateway", metavar="HOST:PORT", help="push busbw per size to a Prometheus Pushgateway")

    scaling = bench_commands.add_parser("scaling", help="strong/weak scaling of the training step over 1..N processes")
    _config_args(scaling)
    scaling.add_argument("--mode", default="weak", choices=["weak", "strong"],
                         help="weak: batch per rank fixed; strong: global batch fixed (default weak)")
    scaling.add_argument("--max-world-size", type=int, metavar="N", help="largest N (default: GPUs, else CPU cores)")
    scaling.add_argument("--batch-per-rank", type=int, help="weak mode: samples per rank (default 256 on GPUs, "
                                                            "where fewer leaves a GPU launch-bound; 64 on CPUs)")
    scaling.add_argument("--global-batch", type=int, help="strong mode: global batch (default 2048 on GPUs, as "
                                                          "the workshop-gpu config; 128 on CPUs)")
    scaling.add_argument("--steps", type=int, default=20, help="timed steps per world size (default 20)")
    scaling.add_argument("--warmup", type=int, default=5, help="warm-up steps per world size (default 5)")
    scaling.add_argument("--json", metavar="PATH", help="write the table as JSON")
    scaling.add_argument("--plot", metavar="PNG", help="write throughput and efficiency against N")
    scaling.add_argument("--pushgateway", metavar="HOST:PORT", help="push the table to a Prometheus Pushgateway")

    pipeline = bench_commands.add_parser("pipeline", help="the lab's data path vs a torchvision DataLoader path")
    _config_args(pipeline)
    pipeline.add_argument("--batch-size", type=int, default=256, help="images per batch for both paths (default 256)")
    pipeline.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes (default 2)")
    pipeline.add_argument("--batches", type=int, default=10, help="batches per timed block (default 10)")
    pipeline.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    pipeline.add_argument("--settle-seconds", type=float, default=0.5,
                          help="pause before each block so DataLoader prefetching ends (default 0.5)")
    pipeline.add_argument("--json", metavar="PATH")

    gpu_check = bench_commands.add_parser("gpu-check", help="every GPU path of the lab on this host, a table last "
                                                            "(make gpu-check)")
    gpu_check.add_argument("--epochs", type=int, default=3, help="epochs of synthetic data to time (default 3)")
    gpu_check.add_argument("--out", default="runs/gpu-check", metavar="DIR",
                           help="step logs, runs and gpu-check.json (default runs/gpu-check)")
    gpu_check.add_argument("--json", metavar="PATH", help="also write the result here")
    gpu_check.add_argument("--skip-without-gpu", action="store_true",
                           help="without a GPU: say so, list the skipped steps and exit 0 (make gpu-check's dry check)")
    gpu_check.add_argument("--quick", action="store_true", help="toy sizes (to test the command itself)")
    gpu_check.add_argument("--allow-cpu", action="store_true", help="run without a GPU (with --quick, for tests)")

    overhead = bench_commands.add_parser("metrics-overhead", help="training step time with the exporter on vs off")
    _config_args(overhead)
    overhead.add_argument("--rounds", type=int, default=3, help="on/off block pairs (default 3)")
    overhead.add_argument("--steps", type=int, default=20, help="steps per block (default 20)")
    overhead.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    overhead.add_argument("--json", metavar="PATH")


def _add_memory(commands) -> None:
    memory = commands.add_parser("memory", help="memory per device: DDP vs ZeRO-1/2/3 and FSDP")
    memory.add_argument("--params", type=float, default=7e9, help="parameter count (default 7e9)")
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
        memory.add_argument(f"--{name}", type=int, help="transformer activation term (give all five)")
    memory.add_argument("--measure", action="store_true", help="also measure ResNet-18: 1 process, DDP and FSDP")
    memory.add_argument("--measure-width", type=int, default=64, help="ResNet-18 width for --measure (default 64)")
    memory.add_argument("--json", metavar="PATH")
    memory.add_argument("--plot", metavar="PNG", help="stacked bars of the estimate")


def _add_report(commands) -> None:
    report = commands.add_parser("report", help="report.md with plots from run directories and benchmark results")
    report.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories, workshop folders, result JSONs")
    report.add_argument("--out", metavar="DIR", help="where report.md and the PNGs go (default: the first folder)")


def _add_doctor(commands) -> None:
    doctor = commands.add_parser("doctor", help="preflight checks of this host, one line each; exit 1 when one fails",
                                 description="Check python, torch, devices, NCCL/gloo, /dev/shm, ports, the run "
                                             "output directory and the interfaces NCCL/GLOO_SOCKET_IFNAME name.")
    doctor.add_argument("--port", action="append", default=[], metavar="PORT[-LAST]",
                        help="a port that must be free here: the rendezvous port, the metrics ports (repeatable)")
    doctor.add_argument("--output-dir", default="runs", metavar="DIR", help="run output directory (default: runs)")
    doctor.add_argument("--expect-gpus", type=int, metavar="N", help="fail unless exactly N CUDA GPUs are visible")
    doctor.add_argument("--min-shm", type=float, default=1.0, metavar="GIB",
                        help="warn when /dev/shm is smaller (default 1 GiB)")
    doctor.add_argument("--json", metavar="PATH", help="write checks and facts as JSON ('-': stdout)")


def _add_data(commands) -> None:
    data = commands.add_parser("data", help="prepare real CIFAR-10 or write synthetic data")
    data_commands = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser, metavar="ACTION")
    prepare = data_commands.add_parser("prepare", help="download and verify CIFAR-10 (needs internet or the archive)")
    prepare.add_argument("--root", default="data", help="data root (default: data)")
    synth = data_commands.add_parser("synth", help="write synthetic CIFAR-shaped data in the CIFAR-10 layout")
    synth.add_argument("--root", default="data", help="data root (default: data)")
    synth.add_argument("--train-size", type=int, default=50000)
    synth.add_argument("--test-size", type=int, default=10000)
    synth.add_argument("--seed", type=int, default=0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv
        return _dispatch(args)
    except LabError as exc:
        if torchrun_env.is_primary_process():  # under torchrun every rank sees the same bad input
            print(f"lab: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "train":
        return _train(args)
    if args.command == "workshop":
        from lab import workshop

        return workshop.run(args.config or workshop.default_config(), args.overrides, args.nproc_per_node,
                            args.output_dir)
    if args.command == "launch":
        return _launch(args)
    if args.command == "data":
        return _data(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "report":
        from lab import report

        print(f"report: {report.build(args.paths, args.out)}")
        return EXIT_OK
    if args.command == "doctor":
        from lab import doctor

        return doctor.run(args.port, args.output_dir, args.expect_gpus, args.min_shm, args.json)
    if args.command == "memory":
        from lab import memory

        return memory.run(args)
    raise LabError(f"unknown command {args.command}")  # argparse refuses these first


def _train(args: argparse.Namespace) -> int:
    from lab import config

    if args.help_config:
        print(config.describe())
        return EXIT_OK
    if args.profile:
        args.overrides = ["train.profile_steps=5", *args.overrides]
    cfg = config.load(args.config, args.overrides)
    if args.nproc_per_node is not None:
        return _launch_train(args, cfg)
    from torch.distributed.elastic.multiprocessing.errors import record

    from lab import train

    record(train.run)(cfg)  # record: torchrun reports a failed rank's traceback, not just its exit code
    return EXIT_OK


def _check_launchable(nproc_per_node: int) -> None:
    if nproc_per_node < 1:
        raise LabError(f"--nproc-per-node: {nproc_per_node} is not a process count; use 1 or more")
    if torchrun_env.launched_by_torchrun():
        raise LabError("--nproc-per-node: already running under torchrun; drop the option")


def _launch_train(args: argparse.Namespace, cfg) -> int:
    from lab import launch, runs

    _check_launchable(args.nproc_per_node)
    _check_training(cfg, args.nproc_per_node)
    overrides = list(args.overrides)
    if not cfg.run.id:  # one id, chosen here, so a restarted worker group finds its checkpoint
        overrides.append(f"run.id={runs.new_run_id(cfg.run.name)}")
    command = launch.torchrun_command(args.nproc_per_node, launch.lab_target("train", args.config, overrides))
    return EXIT_OK if launch.run(command, args.nproc_per_node) == 0 else EXIT_FAILED


def _check_training(cfg, world_size: int | None) -> None:
    """Refuse here what every worker would refuse: one line and exit 2 instead of torchrun's failure report."""
    from lab import config, data

    if world_size is not None:
        config.check_layout(cfg, world_size)
    data.check_source(cfg.data)


def _check_lab_train_target(target: list[str], world_size: int | None) -> None:
    """When the workers will run `-m lab train ...`, load its config now (a bad --set is exit 2 here)."""
    if target[:3] != ["-m", "lab", "train"]:
        return
    from lab import config

    args = build_parser().parse_args(target[2:])
    if args.command == "train" and not args.help_config:
        _check_training(config.load(args.config, args.overrides), world_size)


def _launch(args: argparse.Namespace) -> int:
    from lab import launch

    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        raise LabError("nothing to run; end with `-- -m lab train --config ddp` or `-- SCRIPT.py ARGS`")
    _check_launchable(args.nproc_per_node)
    rdzv = launch.Rendezvous(endpoint=args.rdzv_endpoint, nnodes=args.nnodes, run_id=args.rdzv_id,
                             max_restarts=args.max_restarts, local_addr=args.local_addr,
                             join_timeout=args.join_timeout)
    rdzv.check()
    fixed_nodes = rdzv.nnodes.isdigit()  # an elastic job's world size is known only at the rendezvous
    _check_lab_train_target(target, args.nproc_per_node * int(rdzv.nnodes) if fixed_nodes else None)
    command = launch.torchrun_command(args.nproc_per_node, target, rdzv)
    if args.dry_run:
        print(shlex.join(command))
        return EXIT_OK
    return EXIT_OK if launch.run(command, args.nproc_per_node, rdzv) == 0 else EXIT_FAILED


def _data(args: argparse.Namespace) -> int:
    from lab import data
    from lab.data import cifar

    if args.data_command == "prepare":
        where = cifar.download(args.root)
        print(f"CIFAR-10 verified in {where}")
        return EXIT_OK
    for name in ("train_size", "test_size"):
        if getattr(args, name) < 1:
            raise LabError(f"--{name.replace('_', '-')}: {getattr(args, name)} images; use 1 or more")
    where = data.write_synthetic(args.root, args.train_size, args.test_size, args.seed)
    print(f"synthetic CIFAR-shaped data ({args.train_size} train / {args.test_size} test, seed {args.seed}) "
          f"written to {where}")
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    if args.bench_command == "scaling":
        from lab.bench import scaling

        for name in ("steps", "batch_per_rank", "global_batch"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise LabError(f"--{name.replace('_', '-')}: {getattr(args, name)}; use 1 or more")
        if args.warmup < 0:
            raise LabError(f"--warmup: {args.warmup}; use 0 or more")
        return scaling.run(args)
    if args.bench_command == "gpu-check":
        from lab.bench import gpu_check

        return gpu_check.run(args)
    if args.bench_command == "pipeline":
        from lab.bench import pipeline

        return pipeline.run(args)
    if args.bench_command == "metrics-overhead":
        from lab.bench import metrics_overhead

        return metrics_overhead.run(args)
    if args.nproc_per_node is not None:
        return _relaunch(args)
    from lab.bench import allreduce

    return allreduce.run(args)


def _relaunch(args: argparse.Namespace) -> int:
    """Run this same command under torchrun with --nproc-per-node workers; benchmark gates are judged here,
    from the result file, because torchrun reports any worker's non-zero exit as its own failure."""
    import json
    import tempfile

    from lab import launch

    _check_launchable(args.nproc_per_node)
    tail = _without_option(args.argv, "--nproc-per-node")
    with tempfile.TemporaryDirectory() as tmp:
        result_path = args.json or os.path.join(tmp, "result.json")
        if not args.json:
            tail += ["--json", result_path]
        command = launch.torchrun_command(args.nproc_per_node, ["-m", "lab", *tail])
        if launch.run(command, args.nproc_per_node, extra_env={"LAB_GATE_IN_PARENT": "1"}) != 0:
            return EXIT_FAILED
        with open(result_path) as f:
            return EXIT_GATE_MISSED if json.load(f).get("gate_missed") else EXIT_OK


def _without_option(argv: list[str], option: str) -> list[str]:
    """argv without `option VALUE` / `option=VALUE`."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == option:
            skip = True
        elif not item.startswith(option + "="):
            out.append(item)
    return out
