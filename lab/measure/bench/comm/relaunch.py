"""`lab bench allreduce` and `lab bench collective`: one rank's run, or with --nproc-per-node this same command
run again under torchrun (through the lab's process runner) and its gate judged here.

Bad input is refused here first (one line, exit 2, rather than every worker's failure). The gate is judged in
the parent, from the result files (the workers get --gate-in-parent), because torchrun reports any worker's
non-zero exit as its own failure.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from lab.errors import EXIT_FAILED, EXIT_GATE_MISSED, EXIT_OK
from lab.measure.bench.comm import collective_perf, collective_plan


def allreduce(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        return _relaunch_collectives(args, "allreduce")
    from lab.measure.bench.comm import allreduce as bench

    return bench.run(args)


def collective(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        return _relaunch_collectives(args, "collective")
    return collective_perf.run(args, "collective")


def _relaunch_collectives(args: argparse.Namespace, benchmark: str) -> int:
    """Run this same command under torchrun with --nproc-per-node workers; judge the gate from the result files."""
    from lab.run.cluster import launch

    launch.check_not_nested()
    request = collective_plan.plan(args, benchmark)
    if args.nproc_per_node < 2:
        raise collective_plan.one_rank(benchmark)
    tail = [*without_option(args.argv, "--nproc-per-node"), "--gate-in-parent"]
    with tempfile.TemporaryDirectory() as tmp:
        result_path = args.json or os.path.join(tmp, "result.json")
        if not args.json:
            tail += ["--json", result_path]
        command = launch.torchrun_command(args.nproc_per_node, ["-m", "lab", *tail])
        if launch.run(command, args.nproc_per_node) != 0:
            return EXIT_FAILED
        gate_missed = False
        for path in collective_plan.json_paths(result_path, request.names).values():
            with open(path) as f:
                gate_missed |= bool(json.load(f).get("gate_missed"))
        return EXIT_GATE_MISSED if gate_missed else EXIT_OK


def without_option(argv: list[str], option: str) -> list[str]:
    """argv without `option VALUE` / `option=VALUE`.

    >>> without_option(["bench", "allreduce", "--nproc-per-node", "2", "-e", "1K"], "--nproc-per-node")
    ['bench', 'allreduce', '-e', '1K']
    """
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == option:
            skip = True
        elif not item.startswith(option + "="):
            out.append(item)
    return out
