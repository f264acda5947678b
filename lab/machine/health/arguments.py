"""The command-line arguments of `lab doctor` and `lab validate` (their rows are lab.machine.commands'), with the
argparse types of lab.run.config.arguments; --expect's keys from the checks that read them. Nothing here imports torch.
"""

from __future__ import annotations

import argparse

from lab.machine.health.fabric_checks import EXPECT_KEYS
from lab.run.config.arguments import at_least, output_dir, output_file


def doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="PORT[-LAST]",
        help="a port that must be free here: the rendezvous port, the metrics ports (repeatable)",
    )
    p.add_argument(
        "--output-dir", default="runs", type=output_dir, metavar="DIR", help="run output directory (default: runs)"
    )
    p.add_argument("--expect-gpus", type=at_least(0), metavar="N", help="fail unless exactly N CUDA GPUs are visible")
    p.add_argument(
        "--min-shm", type=float, default=1.0, metavar="GIB", help="warn when /dev/shm is smaller (default 1 GiB)"
    )
    p.add_argument("--json", type=output_file, metavar="PATH", help="write checks and facts as JSON ('-': stdout)")


def validate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "folder", metavar="DIR", help="the check's results: facts-NAME/, node-NAME.json, nodes.json (and their .log)"
    )
    p.add_argument("--nodes", required=True, metavar="N1,N2", help="the nodes in order, the head first")
    p.add_argument("--run-id", required=True, metavar="ID", help="the run this check belongs to")
    p.add_argument("--out", required=True, type=output_file, metavar="PATH", help="where validate.json goes")
    p.add_argument(
        "--floor",
        action="append",
        default=[],
        metavar="[NODE:]KEY=GBPS",
        help="a floor: node, pair, nodes, host_device or d2d, for every node or NODE (repeatable; "
        "default: the node's platform's, or the baseline's)",
    )
    p.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="[NODE:]KEY=VALUE",
        help=f"what a node should have: {', '.join(EXPECT_KEYS)} (repeatable)",
    )
    p.add_argument("--baseline", metavar="FILE", help="fail figures under --baseline-fraction of this baseline")
    p.add_argument("--baseline-fraction", default="0.8", metavar="F", help="of the baseline (default 0.8)")
    p.add_argument(
        "--record-baseline", type=output_file, metavar="FILE", help="write this (passed) run's figures as a baseline"
    )
    p.add_argument(
        "--dcgm-level",
        type=int,
        choices=range(5),
        metavar="N",
        help="the dcgmi diag level the facts were asked for (default: facts-NAME/dcgm-level.txt)",
    )
    p.add_argument(
        "--runner",
        choices=("slurm", "ansible"),
        default="slurm",
        help="who ran the check, as validate.json's platform (default slurm)",
    )


def accept_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the acceptance run's folder, with validate.json (runs/<run id>)")
    p.add_argument(
        "--device-checks",
        metavar="DIR",
        help="each node's device check: DIR/NODE.json or DIR/NODE/gpu-check.json (default RUN_DIR/device-check)",
    )
    p.add_argument("--recap", metavar="FILE", help="the play's saved output: every node's PLAY RECAP must say failed=0")
    p.add_argument("--platform", metavar="KEY", help="every node must be this platform (lab/measure/platforms.py)")
