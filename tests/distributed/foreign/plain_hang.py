"""A plain torch program, which does not import the lab, with one rank's hang planted: what an engineer's own
script looks like under `lab launch` (tests/distributed/test_foreign_hang.py)."""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist


def load(rank: int, plant: str, who: int) -> torch.Tensor:
    if plant == "sleep" and rank == who:
        time.sleep(600)  # the data never comes
    if plant == "kill" and rank == who:
        os.kill(os.getpid(), signal.SIGKILL)  # killed from outside, as the OOM killer would
    return torch.ones(1000)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plant", choices=["sleep", "kill", "skip", "mismatch", "none"], default="none")
    parser.add_argument("--rank", type=int, default=1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = load(rank, args.plant, args.rank)
    for step in range(3):
        if args.plant == "skip" and rank == args.rank and step == 1:
            continue  # this rank skips one all-reduce
        if args.plant == "mismatch" and rank == args.rank and step == 1:
            dist.all_reduce(torch.ones(3))  # an all-reduce the others do not make
        dist.all_reduce(x)  # every rank's all-reduce
    dist.barrier()
    print(f"rank {rank}: {x[0].item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
