"""A plain torch training loop (no import of the lab): a small MLP under DDP on gloo, timed by itself; rank 0 prints
its median step in ms. What scripts/watch_cost.py runs watched and unwatched under `lab launch`."""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        dist.all_reduce(torch.ones(1))  # a small collective of the script's own each step
        times.append(time.perf_counter() - started)
    if dist.get_rank() == 0:
        print(f"step_ms {statistics.median(times[10:]) * 1000:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
