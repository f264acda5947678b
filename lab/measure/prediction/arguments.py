"""`lab predict`'s arguments (its row is lab.measure.commands'). Nothing here imports torch."""

from __future__ import annotations

import argparse

from lab.run.config.arguments import PROCESSES, at_least, config_args, output_file


def readable_file(text: str) -> str:
    """A file that exists and can be read: refused at parse time, in one line."""
    import os

    if not os.path.isfile(text) or not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: no such readable file")
    return text


PLATFORMS = ("h100-sxm-8", "h200-sxm-8", "a100-sxm-8")  # lab.measure.platforms' DGX rows: node and NIC figures


def predict_args(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument(
        "--validate",
        action="store_true",
        help="reproduce the published scaling tables from their inputs, each row with its signed error (no run)",
    )
    p.add_argument(
        "--rows",
        type=readable_file,
        metavar="FILE",
        help="predict the rows of this file (YAML or JSON: docs/prediction.md), each with its signed error (no run)",
    )
    p.add_argument(
        "--calibration",
        type=readable_file,
        metavar="VALIDATE_JSON",
        help="the links a `lab validate` run measured (its validate.json) instead of a platform table or the rows' own",
    )
    p.add_argument(
        "--measure-up-to",
        type=at_least(2),
        default=2,
        metavar="K",
        help="ranks measured to predict from: 1..K (default 2)",
    )
    p.add_argument(
        "--check-up-to",
        type=PROCESSES,
        metavar="N",
        help="ranks predicted and then measured: K+1..N (default: the GPUs present, else 4)",
    )
    p.add_argument(
        "--batch-per-rank", type=at_least(1), help="samples per rank, weak scaling (default 256 on GPUs, 32 on CPUs)"
    )
    p.add_argument("--steps", type=at_least(1), default=8, help="timed steps per world size (default 8)")
    p.add_argument("--warmup", type=at_least(0), default=2, help="warm-up steps per world size (default 2)")
    p.add_argument(
        "--platform",
        default="h100-sxm-8",
        choices=PLATFORMS,
        help="whose node and NIC bandwidth the projection to 8, 64, 512 GPUs uses (default h100-sxm-8)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the rows and the assumptions as JSON")
    p.add_argument("--plot", type=output_file, metavar="PNG", help="predicted against measured step time")
