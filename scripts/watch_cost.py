"""What watching anyone's script costs, and what it buys: `lab launch` of a plain torch loop
(tests/distributed/foreign/plain_steps.py) watched (the default, --hang-seconds 30) and unwatched (--hang-seconds 0),
alternated ROUNDS times in one run, the median step of each and their ratio; then the seconds from the start of a
plain script whose last rank sleeps before its all-reduce (tests/distributed/foreign/plain_hang.py) to the diagnosis
naming it, at the defaults, on 2 and 4 ranks. Usage: python scripts/watch_cost.py [--rounds 5]"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

FOREIGN = Path(__file__).resolve().parents[1] / "tests" / "distributed" / "foreign"
SCRIPT = FOREIGN / "plain_steps.py"


def step_ms(nproc: int, hang_seconds: int, steps: int) -> float:
    done = subprocess.run(
        [sys.executable, "-m", "lab", "launch", "--nproc-per-node", str(nproc), "--hang-seconds", str(hang_seconds)]
        + ["--", str(SCRIPT), "--steps", str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {'watched' if hang_seconds else 'unwatched'} run failed:\n{done.stderr[-3000:]}")
    return float(re.search(r"step_ms (\S+)", done.stdout)[1])  # type: ignore[index]


def seconds_to_named_hang(nproc: int) -> float:
    """From the start of `lab launch` to its diagnosis line, at the default --hang-seconds (the run then ended)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", "launch", "--nproc-per-node", str(nproc), "--stop-seconds", "1", "--"]
        + [str(FOREIGN / "plain_hang.py"), "--plant", "sleep", "--rank", str(nproc - 1)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    named = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if named is None and line.startswith("lab: no progress for"):
            named = time.monotonic() - started
    proc.wait()
    if named is None:
        raise SystemExit(f"no diagnosis from the {nproc}-rank hang")
    return named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    watched, plain = [], []
    for _ in range(args.rounds):
        watched.append(step_ms(args.nproc_per_node, 30, args.steps))
        plain.append(step_ms(args.nproc_per_node, 0, args.steps))
    w, p = statistics.median(watched), statistics.median(plain)
    print(f"ranks {args.nproc_per_node}, {args.rounds} rounds of {args.steps} steps")
    print(f"watched   (--hang-seconds 30): {w:.3f} ms a step  {[round(x, 3) for x in watched]}")
    print(f"unwatched (--hang-seconds 0):  {p:.3f} ms a step  {[round(x, 3) for x in plain]}")
    print(f"watched / unwatched: {w / p:.3f}")
    for nproc in (2, 4):
        print(f"a sleeping rank of {nproc} named {seconds_to_named_hang(nproc):.1f} s after the start")


if __name__ == "__main__":
    main()
