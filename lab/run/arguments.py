"""The command-line arguments of the run wing's commands (lab.run.commands): train, rerun, launch, hang, data.
Argument ranges are argparse types (lab.run.config.arguments), so a parsed Namespace is already a valid request.
Nothing here imports torch.
"""

from __future__ import annotations

import argparse

from lab.run.config.arguments import PROCESSES, at_least, config_args, output_dir, output_file


def train_args(p: argparse.ArgumentParser) -> None:
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


def rerun_args(p: argparse.ArgumentParser) -> None:
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


def launch_args(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--hang-seconds",
        type=at_least(0),
        default=30,
        metavar="S",
        help="a script's ranks watched for hangs: a stall of S seconds with a rank in a collective is named (rank, "
        "collective, line) in hang.json; 0: not watched (lab train watches itself: dist.hang_seconds)",
    )
    p.add_argument(
        "--stop-seconds",
        type=at_least(0),
        default=300,
        metavar="T",
        help="end a named hang T seconds later if it still stands (0: leave it to the collective's timeout)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command line and exit")
    p.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        metavar="-- TARGET",
        help="what every worker runs, e.g. -- -m lab train --config ddp",
    )


def hang_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "folder", metavar="DIR", help="a run directory (or the folder a failed run named) with hang/ or hang.json"
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write the diagnosis as JSON")


def data_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="data", type=output_dir, help="data root (default: data)")


def synth_args(p: argparse.ArgumentParser) -> None:
    data_root(p)
    p.add_argument("--train-size", type=at_least(1, "{} images"), default=50000)
    p.add_argument("--test-size", type=at_least(1, "{} images"), default=10000)
    p.add_argument("--seed", type=at_least(0), default=0)
