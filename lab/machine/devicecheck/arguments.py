"""`lab gpu-check`'s arguments (its row is lab.machine.commands'). Nothing here imports torch."""

from __future__ import annotations

import argparse

from lab.run.config.arguments import at_least, output_dir, output_file


def gpu_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=at_least(1), default=3, help="epochs of synthetic data to time (default 3)")
    p.add_argument(
        "--out",
        default="runs/gpu-check",
        type=output_dir,
        metavar="DIR",
        help="step logs, runs and gpu-check.json (default runs/gpu-check)",
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="also write the result here")
    p.add_argument(
        "--skip-without-gpu",
        action="store_true",
        help="without a GPU: say so, report every step not applicable and exit 0 (make gpu-check's dry check)",
    )
    p.add_argument("--quick", action="store_true", help="toy sizes (to test the command itself)")
    p.add_argument("--allow-cpu", action="store_true", help="run without a GPU (with --quick, for tests)")
    p.add_argument(
        "--only",
        action="append",
        metavar="STEP",
        help="run this step only (repeat for several, e.g. --only doctor --only 'DDP, 1 rank'); the "
        "others are not run, so the check is incomplete (exit 4)",
    )
    p.add_argument(
        "--deadline",
        type=at_least(1, "{} s"),
        default=None,
        metavar="SECONDS",
        help="the whole check ends within this many seconds: each step gets what is left, the steps after it are "
        "not run, and a check with a step not run is incomplete (exit 4) (default: what every step this host "
        "can run is expected to take, over 0.75)",
    )
