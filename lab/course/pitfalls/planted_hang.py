"""Hangs planted on purpose, for lesson 2 and tests/distributed/test_hang.py: a few all-reduces on every rank,
then one rank (--rank) does the wrong thing. Run under the lab's launcher, so its watchdogs and its diagnosis are
the lab's (docs/reliability.md):

    python -m lab launch --nproc-per-node 2 -- -m lab.course.pitfalls.planted_hang --plant other

skip: the rank skips one all-reduce (and reaches the exit's barrier early); other: it calls all_gather where the
others call all_reduce; sleep: it sleeps past the timeout; kill: it SIGKILLs itself; none: nothing wrong.
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as tdist

from lab.run.cluster import dist
from lab.run.config import DistConfig

PLANTS = ("skip", "other", "sleep", "kill", "none")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plant", choices=PLANTS, required=True)
    parser.add_argument("--rank", type=int, default=1, help="the rank that does the wrong thing")
    parser.add_argument("--timeout", type=float, default=20.0, help="dist.timeout_seconds")
    parser.add_argument("--hang", type=float, default=4.0, help="dist.hang_seconds")
    a = parser.parse_args()
    with dist.initialized(DistConfig(device="cpu", timeout_seconds=a.timeout, hang_seconds=a.hang)) as ctx:
        planted = ctx.global_rank == a.rank
        grads = torch.ones(1000)
        for step in range(4):
            if planted and step == 2 and a.plant == "skip":
                continue  # this rank skips one all-reduce: it reaches the exit's barrier one collective early
            if planted and step == 2 and a.plant == "other":
                tdist.all_gather([torch.empty(10) for _ in range(ctx.world_size)], torch.ones(10))  # PLANTED: other
                continue
            if planted and step == 2 and a.plant == "sleep":
                time.sleep(a.timeout * 3)  # PLANTED: sleep
            if planted and step == 2 and a.plant == "kill":
                os.kill(os.getpid(), signal.SIGKILL)  # PLANTED: kill
            tdist.all_reduce(grads)  # THE ALL-REDUCE
        print(f"rank {ctx.global_rank}: done, {grads[0].item():g}", flush=True)


if __name__ == "__main__":
    main()
