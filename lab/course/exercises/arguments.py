"""The command-line arguments of `lab exercise`'s actions (their rows are lab.course.commands'). No torch here."""

from __future__ import annotations

import argparse
from pathlib import Path

from lab.course.exercises import EXERCISES
from lab.run.config.arguments import at_least, output_file


def _name(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=list(EXERCISES), metavar="NAME", help="one of: " + ", ".join(EXERCISES))


def _directory(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir", type=Path, metavar="DIR", help="the folder of your exercise files (default: exercises/ here)"
    )


def list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the table as JSON")


def start_args(p: argparse.ArgumentParser) -> None:
    _name(p)
    _directory(p)


def check_args(p: argparse.ArgumentParser) -> None:
    _name(p)
    p.add_argument("file", nargs="?", type=Path, metavar="FILE", help="your file (default: DIR/NAME.py)")
    _directory(p)
    p.add_argument(
        "--timeout",
        type=at_least(5, "{} s"),
        metavar="S",
        help="seconds each run may take before it is stopped (default: 120, or $LAB_CHECK_TIMEOUT: 300 in a room's "
        "seat, whose runs share the cores; a run stopped while still making progress is said to be slow, not hung, "
        "and a hang is stopped after 30 s without progress whatever the limit)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the checklist as JSON")
    p.add_argument(
        "--class",
        dest="class_name",
        metavar="NAME|MODULE:NAME",
        help="own-ddp only: the class to grade, NAME in FILE (default MyDDP), or NAME in an importable MODULE (a "
        "class written for another course's adapter, such as Stanford CS336's DDPBucketed)",
    )
