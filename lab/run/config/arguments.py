"""The command line's shared argument forms: a config (`--config`, repeated `--set`) and counts (`at_least`).

lab.cli's command table and lab.measure.bench.registry's benchmark table both add them, so they live below both.
argparse
types raise ArgumentTypeError: argparse words it as one line naming the option, and lab.cli exits 2.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path


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
    parse.minimum = minimum  # type: ignore[attr-defined]  # read by the tests that try every option's bad values
    return parse


PROCESSES = at_least(1, "{} is not a process count")


def output_file(text: str) -> str:
    """An argparse type: a file the command will write (JSON, a plot), checked before the command does anything:
    not a folder, and in a folder that is writable or can be made ('-': standard output, where a command takes it).

    >>> output_file("-"), output_file("/tmp/x/result.json")
    ('-', '/tmp/x/result.json')
    >>> output_file("/tmp")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: /tmp is a folder; give a file in it, e.g. /tmp/result.json
    """
    if text == "-":
        return text
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text or repr(text)} is a folder; give a file in it, e.g. {path / 'result.json'}"
        )
    _writable(path.parent, text)
    return text


def output_dir(text: str) -> str:
    """An argparse type: a folder the command will write into (or make), checked before it does anything.

    >>> output_dir("/etc/hostname/sub")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: /etc/hostname/sub: /etc/hostname is a file, not a folder; give a folder to write into
    """
    if not text:
        raise argparse.ArgumentTypeError("'' names no folder; give a folder to write into, e.g. runs")
    _writable(Path(text), text)
    return text


def host_port(text: str) -> str:
    """An argparse type: HOST:PORT (a Pushgateway's address), checked before the command measures anything.

    >>> host_port("gateway:9091")
    'gateway:9091'
    >>> host_port("gateway")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 'gateway' is not HOST:PORT; e.g. pushgateway:9091
    """
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT; e.g. pushgateway:9091")
    return text


def address(text: str) -> str:
    """An argparse type: a host name or IP address to bind or reach (no port: the port has an option of its own).

    >>> address("0.0.0.0"), address("fe80::1")
    ('0.0.0.0', 'fe80::1')
    >>> address("nowhere:8000")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: 'nowhere:8000' is not a host name or address (the port is an option of its own); e.g.
    127.0.0.1
    """
    ipv6 = text.count(":") >= 2
    if not text or any(c.isspace() for c in text) or (":" in text and not ipv6) or "/" in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a host name or address (the port is an option of its own); e.g. 127.0.0.1"
        )
    return text


def url(text: str) -> str:
    """An argparse type: an http(s) URL ('' where the option's default is none).

    >>> url("http://hub:8081"), url("")
    ('http://hub:8081', '')
    """
    from urllib.parse import urlparse

    if text and (urlparse(text).scheme not in ("http", "https") or not urlparse(text).netloc or " " in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL; e.g. http://127.0.0.1:9090")
    return text


def plain_name(text: str) -> str:
    """An argparse type: a name (an image, a network): not empty, no spaces."""
    if not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a name: give one without spaces")
    return text


def executable(text: str) -> str:
    """An argparse type: a program that exists and may be run."""
    import os

    if not os.path.isfile(text) or not os.access(text, os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: no such program, or not executable")
    return text


def _writable(folder: Path, given: str) -> None:
    """The nearest folder of `folder` that exists is a folder, and a probe folder made in it (removed at once)
    proves it writable: permissions alone do not tell for root, a read-only mount or /proc."""
    target = folder.absolute()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{given}: {existing} is a file, not a folder; give a folder to write into")
    try:
        Path(tempfile.mkdtemp(prefix=".lab-probe-", dir=existing)).rmdir()
    except OSError as exc:
        where = "is not writable" if existing == target else f"cannot be made: {existing} is not writable"
        raise argparse.ArgumentTypeError(
            f"{given}: {where} ({exc.strerror or exc}); choose a folder you can write to"
        ) from None


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
