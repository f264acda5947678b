"""Each wing owns its commands: a command's row (help, arguments, handler) is in its wing's table, and its arguments
and handler are functions of that wing. lab.cli only joins the four tables. Adding a command touches one table."""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys

import pytest

from lab import cli
from lab.command import Command
from lab.course import commands as course
from lab.machine import commands as machine
from lab.measure import commands as measure
from lab.run import commands as run

TABLES = {"lab.run": run, "lab.measure": measure, "lab.course": course, "lab.machine": machine}


def rows(table: tuple[Command, ...], prefix: str = "lab") -> list[tuple[str, Command]]:
    found = []
    for row in table:
        name = f"{prefix} {row.name}"
        found.append((name, row))
        if row.actions:
            found.extend(rows(row.actions(), name))
    return found


def misplaced(wing: str, table: tuple[Command, ...]) -> list[str]:
    """Each row whose arguments or handler is not a typed function of `wing`, said as `lab NAME: what, where`."""
    wrong = []
    for name, row in rows(table):
        for part in ("arguments", "handler"):
            function = getattr(row, part)
            if function is None:
                continue
            if not inspect.isfunction(function):
                wrong.append(f"{name}: its {part} is {function!r}, not a function")
            elif not function.__module__.startswith(wing + "."):
                wrong.append(f"{name}: its {part} lives in {function.__module__}, outside {wing}")
            elif part == "handler" and inspect.signature(function).return_annotation not in (int, "int"):
                wrong.append(f"{name}: its handler {function.__qualname__} is not annotated to return an exit code")
    return wrong


@pytest.mark.parametrize("wing", TABLES)
def test_every_row_of_a_wing_has_its_arguments_and_its_handler_in_that_wing(wing):
    assert misplaced(wing, TABLES[wing].COMMANDS) == []


def test_a_row_whose_handler_lives_elsewhere_is_caught():
    """The check above can fail: a course row handled by the machine wing, and one whose handler is a string."""
    planted = (
        Command("stray", "a planted row", handler=machine.doctor),
        Command("named", "a planted row", handler="lab.course.commands.report"),
    )
    assert misplaced("lab.course", planted) == [
        "lab stray: its handler lives in lab.machine.commands, outside lab.course",
        "lab named: its handler is 'lab.course.commands.report', not a function",
    ]


def test_the_cli_joins_the_four_tables_and_adds_nothing_but_the_old_name_of_the_device_check():
    joined = [row.name for table in TABLES.values() for row in table.COMMANDS]
    assert [row.name for row in cli.COMMANDS] == joined
    assert len(set(joined)) == len(joined), "two wings name the same command"
    added = {name for name, _ in rows(cli.COMMANDS)} - {name for t in TABLES.values() for name, _ in rows(t.COMMANDS)}
    assert added == {"lab bench gpu-check"}


def test_the_old_name_of_the_device_check_runs_it_and_says_where_it_went(monkeypatch, capsys):
    from lab.machine.devicecheck import command

    ran = []
    monkeypatch.setattr(command, "run", lambda args: ran.append(args.deadline) or 0)
    bench = next(r for r in cli.COMMANDS if r.name == "bench")
    assert bench.actions is not None
    alias = next(r for r in bench.actions() if r.name == "gpu-check")
    assert alias.handler is not None
    assert alias.handler(argparse.Namespace(deadline=7)) == 0 and ran == [7]
    assert "`lab bench gpu-check` is now `lab gpu-check`" in capsys.readouterr().err


def test_a_launchers_front_checks_the_run_without_importing_torch():
    """`lab train --nproc-per-node N` checks the config, the data and the step plan once, then starts torchrun: its
    own process never trains, so importing torch there (about 1.2 s of a core) would only delay every rank's start."""
    probe = (
        "import sys\n"
        "from lab.run import config, start\n"
        "from lab.run.cluster import launch\n"
        "from lab.run.training import runs\n"
        "start.check_training(config.load('smoke', []), 2)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
