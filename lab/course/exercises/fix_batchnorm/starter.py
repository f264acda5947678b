"""Exercise `fix-batchnorm`: one model, the same weights on every rank, and a different test loss on each.

Run it as

    torchrun --standalone --nproc-per-node 2 exercises/fix_batchnorm.py

It trains a small classifier with a BatchNorm layer under DDP, each rank on a shard that holds some classes only,
then every rank evaluates the model on one shared test set. DDP keeps the weights identical, yet the ranks print
different test losses. Fix the TODO, then check it: `lab exercise check fix-batchnorm` compares the
BatchNorm running statistics every rank holds at the end with each other and with the global batch's. Keep the
command-line options: the check passes its own.
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


def blobs(n: int, seed: int, classes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """n samples of `classes` (cycling) around fixed class centres, noisy enough that the classes overlap."""
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(1234)) * 2.0
    y = torch.tensor(classes)[torch.arange(n) % len(classes)]
    return centres[y] + torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed)), y


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.BatchNorm1d(HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def main(args: argparse.Namespace) -> None:
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Each rank's shard holds some classes only, as when a data set is stored sorted, one class per file.
    groups = min(world_size, CLASSES)
    mine = [c for c in range(CLASSES) if c % groups == rank % groups]
    x, y = blobs(args.per_rank, args.seed + 10 + rank, mine)
    model = mlp(args.seed)
    # TODO(batchnorm): BatchNorm keeps a running mean and variance of what it has seen. They are buffers, not
    # parameters: DDP averages gradients, and here nothing makes the ranks' buffers agree. Make every rank keep the
    # statistics of the global batch (every rank's samples together), as one process given the whole batch would:
    # the check compares them with those. (torch.nn.SyncBatchNorm does this on GPUs only; on the CPU it is yours.)
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    draws = torch.Generator().manual_seed(args.seed + rank)
    model.train()
    for _ in range(args.steps):
        batch = torch.randint(len(x), (args.batch_size,), generator=draws)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[batch].to(device)), y[batch].to(device))
        loss.backward()
        optimizer.step()
    # Every rank evaluates the same weights on the same test set: the same loss, if the ranks agree.
    test_x, test_y = blobs(512, args.seed + 1, list(range(CLASSES)))
    model.eval()
    with torch.no_grad():
        test_loss = F.cross_entropy(model(test_x.to(device)), test_y.to(device))
    print(f"rank {rank} (classes {mine}): test loss {test_loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-rank", type=int, default=256, help="training samples on each rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step on each rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the data")
    main(parser.parse_args())
