"""Command line: the four wings' tables of commands joined (COMMANDS), the parser built from it, dispatch, errors
into exit codes. A command lives in the wing that owns it: its row (help, arguments, handler) in that wing's table
(lab.run.commands, lab.measure.commands, lab.course.commands, lab.machine.commands); nothing else changes here.

Exit codes: 0 ok; 1 a run failed (its traceback is printed); 2 bad input (one line
on stderr naming the file or argument, the key and what would be valid); 3 a
benchmark gate was missed (e.g. --min-busbw) or a deterministic rerun differed.
Argument ranges are argparse types, so a parsed Namespace is already a valid request.
torch is imported only by the handlers that need it, so bad input is refused fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from lab import __version__, broken_pipe
from lab.command import Command
from lab.course import commands as course
from lab.errors import EXIT_BAD_INPUT, LabError
from lab.machine import commands as machine
from lab.measure import commands as measure
from lab.run import commands as run
from lab.run.cluster import torchrun_env

REFUSAL_PAUSE_SECONDS = 1.0  # a non-primary rank's wait before it exits on bad input (main, below)
WINGS = (run, measure, course, machine)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise LabError(f"{message} (see {self.prog} --help)")


def _moved(old: str, row: Command) -> Command:
    """`row` under its old name in another group: it runs as before and says where it went, on stderr."""
    assert row.handler is not None
    handler = row.handler

    def run_moved(args: argparse.Namespace) -> int:
        print(f"lab: note: `{old}` is now `lab {row.name}`", file=sys.stderr, flush=True)
        return handler(args)

    return dataclasses.replace(row, handler=run_moved, help=f"{row.help} (now `lab {row.name}`)")


def _bench_with_old_names() -> tuple[Command, ...]:
    return (*measure.benchmarks(), _moved("lab bench gpu-check", machine.GPU_CHECK))


def _joined() -> tuple[Command, ...]:
    rows = [row for wing in WINGS for row in wing.COMMANDS]
    return tuple(dataclasses.replace(r, actions=_bench_with_old_names) if r.name == "bench" else r for r in rows)


COMMANDS: tuple[Command, ...] = _joined()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lab", description="A lab for PyTorch distributed data-parallel training.")
    parser.add_argument("--version", action="version", version=f"lab {__version__}")
    group = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in COMMANDS:
        _add(group, command)
    return parser


def _add(group: Any, command: Command) -> None:  # group: argparse's private _SubParsersAction
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
        p.set_defaults(handler=command.handler)


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
