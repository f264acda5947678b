#!/usr/bin/env python3
"""A class's exercise checks at once through the room's GPU queue as a Slurm partition: N real `lab exercise check
EXERCISE` (the reference solution, each in a seat folder of its own) started together with LAB_GPU_QUEUE=slurm:gpu
against the test cluster of tests/infra/slurm_cluster.py (partition `gpu`: two nodes of 2 fake GPUs that Slurm hands
out as real ones; no GPU behind them, so each run trains over gloo on the CPU). Prints each check's wait for its
GPUs, how many passed, and the plan's wait (lab.course.room.plan_table.queue_waits) at the measured time a check
held its GPUs.

    .venv/bin/python scripts/slurm-class-checks.py --seats 24 --exercise fix-set-epoch   # as root; Slurm installed

The cluster lives in a temporary folder and stops with the script. Numbers: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.course.room import plan_table  # noqa: E402
from tests.infra.slurm_cluster import GPU_NODES, GPUS_PER_NODE, SlurmCluster, missing_tools  # noqa: E402

WAITED = re.compile(r"from Slurm \(job (\d+) on (\S+), partition gpu\) after (\d+) s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seats", type=int, default=24)
    parser.add_argument("--exercise", default="fix-set-epoch")
    args = parser.parse_args()
    if missing_tools():
        print(f"missing: {', '.join(missing_tools())} (scripts/install-test-tools.sh installs them)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="lab-slurm-class-"))
    root.chmod(0o755)  # munge's socket folder must be world-executable
    cluster = SlurmCluster(root / "cluster").start()
    try:
        module = args.exercise.replace("-", "_")
        solution = ROOT / "lab" / "course" / "exercises" / module / "solution.py"
        checks = {}
        started = time.monotonic()
        for i in range(1, args.seats + 1):
            seat = root / f"seat{i}"
            seat.mkdir()
            shutil.copy(solution, seat / f"{module}.py")
            env = {**cluster.env, "LAB_GPU_QUEUE": "slurm:gpu", "LAB_SEAT": f"seat{i}", "OMP_NUM_THREADS": "1"}
            env["LAB_LESSON_RUNS"] = str(seat / "runs")
            checks[i] = subprocess.Popen(
                [sys.executable, "-m", "lab", "exercise", "check", args.exercise, str(seat / f"{module}.py")],
                env=env,
                cwd=seat,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        waits, held, passed = [], [], 0
        for i, proc in checks.items():
            out, err = proc.communicate(timeout=3600)
            seconds = re.search(r"\((\d+) s\)\s*$", out.strip())
            waited = [int(w) for _, _, w in WAITED.findall(err)]
            passed += proc.returncode == 0
            waits += waited
            if seconds and len(waited) == 1:
                held.append(int(seconds[1]) - waited[0])
            print(f"seat{i}: exit {proc.returncode}, waited {waited} s, {out.strip().splitlines()[-1]}")
        total = time.monotonic() - started
        gpus = len(GPU_NODES) * GPUS_PER_NODE
        each = statistics.mean(held) if held else float("nan")
        predicted, predicted_mean = plan_table.queue_waits(args.seats, gpus, each)
        if not waits:
            print("no check said its wait for Slurm's GPUs: see each seat's line above", file=sys.stderr)
            return 1
        print(
            f"{args.seats} checks of {args.exercise} at once through Slurm ({gpus} GPUs, 2 a run): {passed} passed; "
            f"longest wait {max(waits)} s (plan {predicted:.0f} s at {each:.1f} s a check), mean "
            f"{statistics.mean(waits):.0f} s (plan {predicted_mean:.0f} s); all done in {total:.0f} s"
        )
        return 0 if passed == args.seats else 1
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
