"""The command line's shared argument forms: a config (`--config`, repeated `--set`) and counts (`at_least`).

lab.cli's command table and lab.bench.registry's benchmark table both add them, so they live below both. argparse
types raise ArgumentTypeError: argparse words it as one line naming the option, and lab.cli exits 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


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


def config_args(p: argparse.ArgumentParser) -> None:
    """--config NAME|PATH and repeated --set SECTION.KEY=VALUE, as every command that takes a config has them."""
    p.add_argument(
        "--config",
        metavar="PATH",
        help="YAML config file, or a shipped name (smoke, baseline, ddp, workshop-cpu, workshop-gpu)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config key (repeatable), e.g. --set train.lr=0.1",
    )
