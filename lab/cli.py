"""Command line: one table of subcommands (COMMANDS), the parser built from it, dispatch, errors into exit codes.

Exit codes: 0 ok; 1 a run failed (its traceback is printed); 2 bad input (one line
on stderr naming the file or argument, the key and what would be valid); 3 a
benchmark gate was missed (e.g. --min-busbw) or a deterministic rerun differed.
Each row names its help, how its arguments are added, and its handler (lab.commands', or a module's
function named "module.function" and imported when called); `lab bench`'s rows are lab.bench.registry's.
Argument ranges are argparse types, so a parsed Namespace is already a valid request.
torch is imported only by the handlers that need it, so bad input is refused fast.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from lab import __version__, broken_pipe
from lab import commands as handlers  # each subcommand's handler (lab.commands)
from lab.bench import registry
from lab.cluster import torchrun_env
from lab.config.arguments import (
    PROCESSES,
    at_least,
    config_args,
    output_dir,
    output_file,
)
from lab.errors import EXIT_BAD_INPUT, LabError
from lab.exercises import arguments as exercise_arguments
from lab.health import arguments as health_arguments
from lab.prediction import arguments as prediction_arguments
from lab.room import arguments as room_arguments
from lab.sizing import arguments as sizing_arguments

REFUSAL_PAUSE_SECONDS = 1.0  # a non-primary rank's wait before it exits on bad input (main, below)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise LabError(f"{message} (see {self.prog} --help)")


@dataclass(frozen=True)
class Command:
    """One subcommand: `lab NAME`, or a group of them (`lab bench NAME`, `lab data ACTION`) when it has actions."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], object] | None = None  # adds them (what it returns is unused)
    handler: Callable[[argparse.Namespace], int] | str | None = None  # a function, or "module.function"
    description: str | None = None
    actions: Callable[[], tuple[Command, ...]] | None = None  # the group's subcommands, read when the parser is built
    metavar: str = "NAME"


def _handler(handler: Callable[[argparse.Namespace], int] | str) -> Callable[[argparse.Namespace], int]:
    if callable(handler):
        return handler
    return lambda args: registry.call(handler, args)  # imported when called: torch comes with it


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lab", description="A lab for PyTorch distributed data-parallel training.")
    parser.add_argument("--version", action="version", version=f"lab {__version__}")
    group = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in COMMANDS:
        _add(group, command)
    return parser


def _add(group, command: Command) -> None:
    p = group.add_parser(command.name, help=command.help, description=command.description)
    if command.arguments:
        command.arguments(p)
    if command.actions:
        actions = p.add_subparsers(
            dest=f"{command.name}_command", required=True, parser_class=_Parser, metavar=command.metavar
        )
        for action in command.actions():
            _add(actions, action)
    else:
        assert command.handler is not None, f"lab {command.name}: a command without actions needs a handler"
        p.set_defaults(handler=_handler(command.handler))


# ----------------------------------------------------------------------------- each command's arguments


def _train_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--nproc-per-node",
        type=PROCESSES,
        metavar="N",
        help="start torchrun with N processes on this node and print its command line",
    )
    p.add_argument("--help-config", action="store_true", help="list every config key with its default")
    p.add_argument(
        "--profile",
        action="store_true",
        help="write a torch.profiler trace of 5 steps after warm-up (same as --set train.profile_steps=5)",
    )
    # A worker's side of --nproc-per-node and `lab launch`: the run's config.json, which the parent checked.
    p.add_argument("--resolved", metavar="PATH", help=argparse.SUPPRESS)


def _rerun_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with manifest.json and metrics.jsonl")
    p.add_argument("--steps", type=at_least(1), metavar="N", help="rerun and compare only the first N steps")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change one config key for the rerun (repeatable), e.g. --set run.seed=1",
    )
    p.add_argument(
        "--output-dir",
        type=output_dir,
        metavar="DIR",
        help="where the new run directory goes (default: beside RUN_DIR)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the comparison as JSON")


def _workshop_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--nproc-per-node",
        type=PROCESSES,
        metavar="N",
        help="DDP processes (default: 2 and 4 on a CPU; 2, 4, 8 ... up to the GPUs present)",
    )
    p.add_argument(
        "--output-dir", default="runs", type=output_dir, metavar="DIR", help="where the workshop folder goes"
    )
    p.add_argument(
        "--only",
        metavar="PART[,PART]",
        help="run some parts: training, pitfalls, allreduce, scaling, levers, memory, strategies (the report closes)",
    )


def _launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", type=PROCESSES, default=1, metavar="N", help="workers on this node")
    p.add_argument("--nnodes", default="1", metavar="N|MIN:MAX", help="nodes in the job (MIN:MAX: elastic)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="the head node's c10d rendezvous (multi-node)")
    p.add_argument("--rdzv-id", metavar="ID", help="one id for every node of the job (the run id)")
    p.add_argument(
        "--max-restarts",
        type=at_least(0),
        default=0,
        metavar="K",
        help="restart the worker group up to K times after a failure",
    )
    p.add_argument(
        "--join-timeout",
        type=int,
        metavar="SECONDS",
        help="fail when not every node arrived within this time (torchrun's default: 600)",
    )
    p.add_argument("--local-addr", metavar="ADDR", help="this node's address, when it has several")
    p.add_argument(
        "--slurm",
        action="store_true",
        help="one srun task per node: --nnodes, --rdzv-endpoint, --local-addr and --rdzv-id from the "
        "Slurm allocation (docs/slurm.md)",
    )
    p.add_argument(
        "--rdzv-port",
        type=int,
        default=29400,
        metavar="PORT",
        help="with --slurm: the rendezvous port on the allocation's first node",
    )
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command line and exit")
    p.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="-- TARGET",
        help="what every worker runs, e.g. -- -m lab train --config ddp",
    )


def _benchmarks() -> tuple[Command, ...]:
    """`lab bench`'s subcommands: the rows of lab.bench.registry that are commands."""
    return tuple(
        Command(b.name, b.help, b.arguments, b.run, b.description)
        for b in registry.BENCHMARKS.values()
        if b.arguments is not None and b.run is not None
    )


def _pitfall_args(p: argparse.ArgumentParser) -> None:
    from lab.pitfalls import PITFALLS  # names and one-line summaries only: no torch at parse time

    p.add_argument(
        "name",
        nargs="?",
        choices=list(PITFALLS),
        metavar="NAME",
        help="one of: " + ", ".join(PITFALLS) + " (none: list them)",
    )
    p.add_argument("--nproc-per-node", type=PROCESSES, metavar="N", help="ranks (default: the GPUs present, else 2)")
    p.add_argument(
        "--json", type=output_file, metavar="PATH", help="write the broken and the fixed measurement as JSON"
    )


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories, workshop folders, result JSONs")
    p.add_argument(
        "--out", type=output_dir, metavar="DIR", help="where report.md and the PNGs go (default: the first folder)"
    )


def _hang_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "folder", metavar="DIR", help="a run directory (or the folder a failed run named) with hang/ or hang.json"
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the diagnosis as JSON")


def _data_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="data", type=output_dir, help="data root (default: data)")


def _synth_args(p: argparse.ArgumentParser) -> None:
    _data_root(p)
    p.add_argument("--train-size", type=at_least(1, "{} images"), default=50000)
    p.add_argument("--test-size", type=at_least(1, "{} images"), default=10000)
    p.add_argument("--seed", type=at_least(0), default=0)


def _data_actions() -> tuple[Command, ...]:
    return (
        Command(
            "prepare", "download and verify CIFAR-10 (needs internet or the archive)", _data_root, handlers.data_prepare
        ),
        Command("synth", "write synthetic CIFAR-shaped data in the CIFAR-10 layout", _synth_args, handlers.data_synth),
    )


def _exercise_actions() -> tuple[Command, ...]:
    return (
        Command(
            "list",
            "the exercises: lesson, minutes, what you write",
            exercise_arguments.list_args,
            "lab.exercises.command.listing",
        ),
        Command(
            "start",
            "copy an exercise's starter into your folder (never over your work)",
            exercise_arguments.start_args,
            "lab.exercises.command.start_command",
        ),
        Command(
            "check",
            "run your file under torchrun, watched, and print the checklist: exit 0 all hold, 1 one fails",
            exercise_arguments.check_args,
            "lab.exercises.command.check",
        ),
    )


def _room_actions() -> tuple[Command, ...]:
    return (
        Command(
            "plan",
            "seats with disjoint GPUs, cores and memory: the table to check before the room arrives",
            room_arguments.plan_args,
            "lab.room.plan.run",
        ),
        Command(
            "serve",
            "JupyterHub serving the room's seats, in the foreground (make room)",
            room_arguments.serve_args,
            "lab.room.serve.run",
        ),
        Command(
            "status",
            "every seat by lesson: passed, failed, running, not run; its newest run and memory",
            room_arguments.status_args,
            "lab.room.status.run",
        ),
        Command(
            "reset",
            "a seat afresh: its copy of the lessons and its runs deleted",
            room_arguments.seat_args,
            "lab.room.seats.reset",
        ),
        Command(
            "prepare-seat",
            "copy the lessons into a seat's folder where missing (a seat container's start)",
            room_arguments.prepare_seat_args,
            "lab.room.seats.prepare",
        ),
    )


# ----------------------------------------------------------------------------- the table

COMMANDS: tuple[Command, ...] = (
    Command("train", "train ResNet-18 (DDP under torchrun)", _train_args, handlers.train),
    Command(
        "rerun",
        "train again from a run's manifest and compare the loss curves",
        _rerun_args,
        "lab.training.rerun.run",
        description="Run RUN_DIR's recorded config, seed, data and world size again into a new run directory, "
        "then compare the loss curves step by step. Exit 3 when a deterministic run's curve is not "
        "bit-identical.",
    ),
    Command(
        "workshop", "baseline, then DDP with the same global batch, then compare", _workshop_args, handlers.workshop
    ),
    Command(
        "launch",
        "start torchrun on this node (one node, or one of a multi-node c10d rendezvous)",
        _launch_args,
        handlers.launch,
        description="Start torchrun on this node with the command line the lab builds, e.g. "
        "`lab launch --nnodes 2 --nproc-per-node 8 --rdzv-endpoint head:29400 --rdzv-id r1 "
        "-- -m lab train --config ddp`. What follows `--` is what every worker runs: a module "
        "(-m ...) or a script and its arguments.",
    ),
    Command(
        "bench",
        "benchmarks: all-reduce and the other collectives, scaling, levers, data pipeline, metrics overhead, GPU check",
        actions=_benchmarks,
    ),
    Command(
        "pitfall",
        "the course's pitfalls: the mistake, then the fix, measured",
        _pitfall_args,
        "lab.pitfalls.command.run",
    ),
    Command(
        "exercise",
        "hands-on: you write the distributed code, the lab runs it on several ranks and measures what it did",
        actions=_exercise_actions,
        metavar="ACTION",
    ),
    Command(
        "memory", "memory per device: DDP vs ZeRO-1/2/3 and FSDP", sizing_arguments.memory_args, "lab.sizing.memory.run"
    ),
    Command(
        "choose",
        "which tool for this model: DDP, ZeRO-1/2, FSDP full/hybrid shard or offload",
        sizing_arguments.choose_args,
        "lab.sizing.choose.run",
        description="Walk the scaling lecture's decision tree with numbers and print the lab train line it ends "
        "on, e.g. `lab choose --params 70B --nodes 2 --device h100 --interconnect ib-ndr`.",
    ),
    Command(
        "predict",
        "scaling predicted past the machines at hand; --validate against published tables",
        prediction_arguments.predict_args,
        prediction_arguments.run,
        description="Measure the training step on 1..K ranks, predict it on K+1..N with the step-time model "
        "(ring/tree all-reduce, bucket pipelining, DDP/ZeRO/FSDP volumes), measure those too and print each "
        "error; project to 8, 64 and 512 GPUs on a platform's links. --validate reproduces published scaling "
        "tables (PyTorch's DDP benchmark, Horovod's) from their inputs, row by row (docs/prediction.md).",
    ),
    Command(
        "hang",
        "which rank waited in which collective, on which line: what a hung or killed run left",
        _hang_args,
        "lab.cluster.hang.command",
        description="Read DIR's hang.json, or its ranks' records (hang/rank-N.json) that each rank's watchdog "
        "wrote when it stalled, failed or was stopped, and print who waited in which collective (sequence "
        "number, operation, sizes, line), who never came, who was elsewhere and who died. Exit 1 when DIR "
        "holds none (docs/reliability.md).",
    ),
    Command("report", "report.md with plots from run directories and benchmark results", _report_args, handlers.report),
    Command("data", "prepare real CIFAR-10 or write synthetic data", actions=_data_actions, metavar="ACTION"),
    Command(
        "room",
        "a workshop room: JupyterHub with a seat per learner, each with its own GPUs",
        actions=_room_actions,
        metavar="ACTION",
    ),
    Command(
        "doctor",
        "preflight checks of this host, one line each; exit 1 when one fails",
        health_arguments.doctor_args,
        handlers.doctor,
        description="Check python, torch, devices, NCCL/gloo, /dev/shm, ports, the run output directory and the "
        "interfaces NCCL/GLOO_SOCKET_IFNAME name.",
    ),
    Command(
        "validate",
        "the fabric check's verdict from its facts and all-reduce results: validate.json",
        health_arguments.validate_args,
        "lab.health.validate.run",
        description="Pick each node's platform from its facts (scripts/node-facts.sh), judge its all-reduce "
        "results (node-NAME.json, nodes.json) at the sizes >= 1 GiB and its facts (PCIe, "
        "InfiniBand, GPUDirect RDMA, DCGM, XIDs, row remaps, the fabric manager) and write "
        "validate.json. Exit 1 when a floor is missed, a check fails or a result is missing.",
    ),
    Command(
        "accept",
        "is this cluster accepted? validate.json, each node's device check and the play's recap: PASS or FAIL",
        health_arguments.accept_args,
        "lab.health.acceptance.run",
        description="Read RUN_DIR/validate.json (the validate play's or slurm/validate.sbatch's), each GPU node's "
        "device check (RUN_DIR/device-check/NODE.json or NODE/gpu-check.json: make gpu-check's gpu-check.json) "
        "and, with --recap, the play's PLAY RECAP; print PASS or FAIL with each reason (docs/acceptance.md). "
        "Exit 1 when the cluster is not accepted.",
    ),
)


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
        elif torchrun_env.launched_by_torchrun():
            # The others leave a moment after rank 0: the first rank to exit makes torchrun stop the rest, and a
            # rank 0 stopped before it printed leaves the refusal unsaid (seen on a loaded CI machine).
            time.sleep(REFUSAL_PAUSE_SECONDS)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `lab ... | head`: the reader has what it wanted (lab.broken_pipe)
        broken_pipe.silence_stdout()
        return broken_pipe.EXIT_BROKEN_PIPE
    except KeyboardInterrupt as exc:  # Ctrl-C, or the runner's Stopped (SIGTERM): 128 + the signal, as a shell says
        return 128 + getattr(exc, "signum", 2)
