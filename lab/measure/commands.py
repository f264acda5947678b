"""The measure wing's commands, one row each: bench (a group: lab.measure.bench.registry's rows), predict, memory,
choose. Arguments live beside their code (lab.measure.prediction.arguments, lab.measure.sizing.arguments); each
handler imports what it runs when it is called. lab.cli joins this table with the other wings'.
"""

from __future__ import annotations

import argparse

from lab.command import Command
from lab.measure.bench import registry
from lab.measure.prediction import arguments as prediction_arguments
from lab.measure.sizing import arguments as sizing_arguments


def predict(args: argparse.Namespace) -> int:
    if args.validate or args.rows:
        from lab.measure.prediction import validate

        return validate.run(args)
    from lab.measure.prediction import measured

    return measured.run(args)


def memory(args: argparse.Namespace) -> int:
    from lab.measure.sizing import memory as sizes

    return sizes.run(args)


def choose(args: argparse.Namespace) -> int:
    from lab.measure.sizing import choose_output

    return choose_output.run(args)


def benchmarks() -> tuple[Command, ...]:
    """`lab bench`'s commands: the registry's rows, read when the parser is built (a test may add one)."""
    return tuple(registry.BENCHMARKS.values())


COMMANDS: tuple[Command, ...] = (
    Command(
        "bench",
        "benchmarks: all-reduce and the other collectives, scaling, levers, data pipeline, metrics overhead",
        actions=benchmarks,
    ),
    Command(
        "predict",
        "scaling predicted past the machines at hand; --validate against published tables",
        prediction_arguments.predict_args,
        predict,
        description="Measure the training step on 1..K ranks, predict it on K+1..N with the step-time model "
        "(ring/tree all-reduce, bucket pipelining, DDP/ZeRO/FSDP volumes), measure those too and print each "
        "error; project to 8, 64 and 512 GPUs on a platform's links. --validate reproduces published scaling "
        "tables (PyTorch's DDP benchmark, Horovod's) from their inputs, row by row (docs/prediction.md).",
    ),
    Command("memory", "memory per device: DDP vs ZeRO-1/2/3 and FSDP", sizing_arguments.memory_args, memory),
    Command(
        "choose",
        "which tool for this model: DDP, ZeRO-1/2, FSDP full/hybrid shard or offload",
        sizing_arguments.choose_args,
        choose,
        description="Walk the scaling lecture's decision tree with numbers and print the lab train line it ends "
        "on, e.g. `lab choose --params 70B --nodes 2 --device h100 --interconnect ib-ndr`.",
    ),
)
