"""One row of a command table: what `lab NAME` (or `lab GROUP NAME`) parses and which function runs it.

Each wing owns one table of its commands (lab.run.commands, lab.measure.commands, lab.course.commands,
lab.machine.commands); lab.cli joins the four into the parser. A row's `arguments` adds its options to an argparse
parser and its `handler` takes the parsed Namespace and returns an exit code; both are functions of the wing that
owns the row (tests/unit/test_commands.py holds it), and a handler imports what it runs when it is called, so
building the parser imports no torch.

>>> Command("hello", "say hello", handler=lambda args: 0).name
'hello'
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

Arguments = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """`lab NAME`, or a group of them (`lab bench NAME`, `lab data ACTION`) when it has actions."""

    name: str
    help: str
    arguments: Arguments | None = None
    handler: Handler | None = None
    description: str | None = None  # --help's text, when more than `help`
    actions: Callable[[], tuple[Command, ...]] | None = None  # a group's commands, read when the parser is built
    metavar: str = "NAME"

    def __post_init__(self) -> None:
        if (self.handler is None) == (self.actions is None):
            raise ValueError(f"lab {self.name}: a command has a handler or actions, one of the two")
