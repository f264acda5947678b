"""Command line: parse arguments, dispatch, and turn errors into exit codes.

Exit codes: 0 ok; 1 a run failed (its traceback is printed); 2 bad input (one line
on stderr naming the file or argument, the key and what would be valid).
torch is imported only by the commands that need it, so bad input is refused fast.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from lab import __version__
from lab.errors import LabError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


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

    train = commands.add_parser("train", help="train ResNet-18 (DDP under torchrun)")
    _config_args(train)
    train.add_argument("--nproc-per-node", type=int, metavar="N",
                       help="start torchrun with N processes on this node and print its command line")
    train.add_argument("--help-config", action="store_true", help="list every config key with its default")

    workshop = commands.add_parser("workshop", help="baseline, then DDP with the same global batch, then compare")
    _config_args(workshop)
    workshop.add_argument("--nproc-per-node", type=int, default=2, metavar="N", help="DDP processes (default 2)")
    workshop.add_argument("--output-dir", default="runs", metavar="DIR", help="where the workshop folder goes")

    data = commands.add_parser("data", help="prepare real CIFAR-10 or write synthetic data")
    data_commands = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser, metavar="ACTION")
    prepare = data_commands.add_parser("prepare", help="download and verify CIFAR-10 (needs internet or the archive)")
    prepare.add_argument("--root", default="data", help="data root (default: data)")
    synth = data_commands.add_parser("synth", help="write synthetic CIFAR-shaped data in the CIFAR-10 layout")
    synth.add_argument("--root", default="data", help="data root (default: data)")
    synth.add_argument("--train-size", type=int, default=50000)
    synth.add_argument("--test-size", type=int, default=10000)
    synth.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return _dispatch(args)
    except LabError as exc:
        if _is_primary():
            print(f"lab: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def _is_primary() -> bool:
    # Under torchrun every rank sees the same bad input; one line is enough.
    return os.environ.get("RANK", "0") == "0"


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "train":
        return _train(args)
    if args.command == "workshop":
        from lab import workshop

        return workshop.run(args.config or "workshop-cpu", args.overrides, args.nproc_per_node, args.output_dir)
    if args.command == "data":
        return _data(args)
    raise LabError(f"unknown command {args.command}")  # argparse refuses these first


def _train(args: argparse.Namespace) -> int:
    from lab import config

    if args.help_config:
        print(config.describe())
        return EXIT_OK
    cfg = config.load(args.config, args.overrides)
    if args.nproc_per_node is not None:
        return _launch_train(args, cfg)
    from torch.distributed.elastic.multiprocessing.errors import record

    from lab import train

    record(train.run)(cfg)  # record: torchrun reports a failed rank's traceback, not just its exit code
    return EXIT_OK


def _launch_train(args: argparse.Namespace, cfg) -> int:
    from lab import config, data, launch, runs

    if args.nproc_per_node < 1:
        raise LabError(f"--nproc-per-node: {args.nproc_per_node} is not a process count; use 1 or more")
    if "LOCAL_RANK" in os.environ:
        raise LabError("--nproc-per-node: already running under torchrun; drop the option")
    # Refuse here what every worker would refuse: one line and exit 2 instead of torchrun's failure report.
    config.check_layout(cfg, args.nproc_per_node)
    data.check_source(cfg.data)
    overrides = list(args.overrides)
    if not cfg.run.id:  # one id, chosen here, so a restarted worker group finds its checkpoint
        overrides.append(f"run.id={runs.new_run_id(cfg.run.name)}")
    command = launch.torchrun_command(args.nproc_per_node, launch.lab_target("train", args.config, overrides))
    print(f"$ {shlex.join(command)}", flush=True)
    return EXIT_OK if subprocess.call(command, env=launch.worker_env(args.nproc_per_node)) == 0 else EXIT_FAILED


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
