"""The run wing's commands, one row each: train, rerun, launch, hang, data.

A row holds the command's help, its arguments (lab.run.arguments) and its handler (here, or lab.run.start for the
two that start processes); a handler imports what it runs when it is called. lab.cli joins this table with the
other wings'.
"""

from __future__ import annotations

import argparse

from lab.command import Command
from lab.errors import EXIT_OK
from lab.run import arguments, start


def rerun(args: argparse.Namespace) -> int:
    from lab.run.training import rerun as reruns

    return reruns.run(args)


def hang(args: argparse.Namespace) -> int:
    from lab.run.cluster import hang as hangs

    return hangs.command(args)


def data_prepare(args: argparse.Namespace) -> int:
    from lab.run.data import cifar

    print(f"CIFAR-10 verified in {cifar.download(args.root)}")
    return EXIT_OK


def data_synth(args: argparse.Namespace) -> int:
    from lab.run import data

    where = data.write_synthetic(args.root, args.train_size, args.test_size, args.seed)
    print(
        f"synthetic CIFAR-shaped data ({args.train_size} train / {args.test_size} test, seed {args.seed}) "
        f"written to {where}"
    )
    return EXIT_OK


def _data_actions() -> tuple[Command, ...]:
    return (
        Command(
            "prepare", "download and verify CIFAR-10 (needs internet or the archive)", arguments.data_root, data_prepare
        ),
        Command("synth", "write synthetic CIFAR-shaped data in the CIFAR-10 layout", arguments.synth_args, data_synth),
    )


COMMANDS: tuple[Command, ...] = (
    Command("train", "train ResNet-18 (DDP under torchrun)", arguments.train_args, start.train),
    Command(
        "rerun",
        "train again from a run's manifest and compare the loss curves",
        arguments.rerun_args,
        rerun,
        description="Run RUN_DIR's recorded config, seed, data and world size again into a new run directory, "
        "then compare the loss curves step by step. Exit 3 when a deterministic run's curve is not "
        "bit-identical.",
    ),
    Command(
        "launch",
        "start torchrun on this node (one node, or one of a multi-node c10d rendezvous)",
        arguments.launch_args,
        start.launch,
        description="Start torchrun on this node with the command line the lab builds, e.g. "
        "`lab launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint head:29400 --rdzv-id r1 "
        "-- -m lab train --config ddp`. What follows `--` is what every worker runs: a module "
        "(-m ...) or a script and its arguments.",
    ),
    Command(
        "hang",
        "which rank waited in which collective, on which line: what a hung or killed run left",
        arguments.hang_args,
        hang,
        description="Read DIR's hang.json, or its ranks' records (hang/rank-N.json) that each rank's watchdog "
        "wrote when it stalled, failed or was stopped, and print who waited in which collective (sequence "
        "number, operation, sizes, line), who never came, who was elsewhere and who died. Exit 1 when DIR "
        "holds none (docs/reliability.md).",
    ),
    Command("data", "prepare real CIFAR-10 or write synthetic data", actions=_data_actions, metavar="ACTION"),
)
