#!/usr/bin/env python3
"""What lab/frozen_imports.py saves: the CPU-seconds of the same processes with torch's import-time objects frozen
out of the garbage collector (the lab's default) and not (LAB_FREEZE_IMPORTS=0), run in turn, REPEATS pairs each:

- `import`: torch's and torchvision's import and the interpreter's exit alone, as in the lab's own program;
- `lab train`: a 2-rank `lab train --config smoke` (the front, torchrun's agent, two ranks), as the tests run it.

    .venv/bin/python scripts/bench-frozen-imports.py [--repeats 5]

CPU-seconds are the children's user + system time (every process waited for, the ranks under torchrun included);
prints the medians and their ratio, frozen / not. Numbers: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

CASES = {
    # as in the lab's own program (python -m lab ...); `-c` alone is someone else's, never frozen
    "import": ["-c", "import lab.frozen_imports as f; f.install(['python', '-m', 'lab']); import torch, torchvision"],
    "lab train": ["-m", "lab", "train", "--config", "smoke", "--set", "model.width=8", "--nproc-per-node", "2"],
}


def cpu_seconds(argv: list[str], frozen: bool, out: str, index: int) -> float:
    """One run's CPU-seconds, over every process it waited for."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LAB_FREEZE_IMPORTS": "1" if frozen else "0"}
    if "train" in argv:
        argv = [*argv, "--set", f"run.output_dir={out}", "--set", f"run.id={'frozen' if frozen else 'not'}-{index}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *argv], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    print("| process | frozen (median CPU-s) | not frozen | frozen / not |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as out:
        for name, argv in CASES.items():
            runs: dict[bool, list[float]] = {True: [], False: []}
            for index in range(repeats):  # in turn, so a machine's slower minute falls on both
                for frozen in (False, True):
                    runs[frozen].append(cpu_seconds(argv, frozen, out, index))
            frozen_s, not_s = statistics.median(runs[True]), statistics.median(runs[False])
            print(f"| {name} | {frozen_s:.2f} | {not_s:.2f} | {frozen_s / not_s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
