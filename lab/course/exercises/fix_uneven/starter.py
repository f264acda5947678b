"""Exercise `fix-uneven`: the ranks hold shards of different sizes, and the run never ends.

Run it as

    torchrun --standalone --nproc-per-node 2 exercises/fix_uneven.py

and it trains a small classifier under DDP, each rank over its own slice of the data, as when a data set comes
split into files of different lengths: rank 0's slice has a few samples more, so one batch more. Watch it hang
after the last full batch. Make it end, with every rank holding the same weights, then check it:
`lab exercise check fix-uneven`. Keep the command-line options: the check passes its own.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

FEATURES, CLASSES, HIDDEN = 8, 4, 16


def setup() -> torch.device:
    local_rank = int(os.environ["LOCAL_RANK"])  # torchrun sets it, with RANK and WORLD_SIZE
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples around CLASSES fixed centres, noisy enough that the classes overlap (class: the index cycling)."""
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(1234)) * 2.0
    y = torch.arange(n) % CLASSES
    return centres[y] + torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed)), y


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def my_slice(rank: int, world_size: int, per_rank: int, extra: int) -> tuple[int, int]:
    """[start, end) of this rank's samples: rank 0 holds `extra` more than the others."""
    sizes = [per_rank + extra] + [per_rank] * (world_size - 1)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


def main(args: argparse.Namespace) -> None:
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, y = blobs(args.per_rank * world_size + args.extra, args.seed)
    start, end = my_slice(rank, world_size, args.per_rank, args.extra)
    batches = list(zip(x[start:end].split(args.batch_size), y[start:end].split(args.batch_size)))
    model = DDP(mlp(args.seed).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # TODO(uneven): rank 0 has one batch more than the others. In that batch its backward waits for the other
    # ranks to add their gradients, and they have left this loop. Make every rank's last step end together.
    for step, (xb, yb) in enumerate(batches):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}")
    print(f"rank {rank} done: {len(batches)} batches")
    dist.barrier()  # every rank done before the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-rank", type=int, default=32, help="samples in each rank's slice but rank 0's")
    parser.add_argument("--extra", type=int, default=5, help="rank 0's samples beyond --per-rank")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per step on each rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the data")
    main(parser.parse_args())
