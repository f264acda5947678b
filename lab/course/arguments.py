"""The command-line arguments of the course wing's own commands (lab.course.commands): workshop, report, pitfall.
`lab exercise`'s are lab.course.exercises.arguments', `lab room`'s lab.course.room.arguments'. Nothing here imports
torch.
"""

from __future__ import annotations

import argparse

from lab.run.config.arguments import PROCESSES, config_args, output_dir, output_file


def workshop_args(p: argparse.ArgumentParser) -> None:
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


def pitfall_args(p: argparse.ArgumentParser) -> None:
    from lab.course.pitfalls import PITFALLS  # names and one-line summaries only: no torch at parse time

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


def report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories, workshop folders, result JSONs")
    p.add_argument(
        "--out", type=output_dir, metavar="DIR", help="where report.md and the PNGs go (default: the first folder)"
    )
