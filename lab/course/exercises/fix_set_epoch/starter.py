"""Exercise `fix-set-epoch`: every epoch of this DDP loop is the same epoch.

Run it as

    torchrun --standalone --nproc-per-node 2 exercises/fix_set_epoch.py

It trains a small classifier under DDP for a few epochs, a DistributedSampler giving each rank its share of
a shuffled data set. The shuffle is not doing what it should: fix the TODO, then check it with
`lab exercise check fix-set-epoch`, which counts the samples each rank reads in each epoch.
Keep the command-line options: the check passes its own.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

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


def main(args: argparse.Namespace) -> None:
    device = setup()
    dataset = TensorDataset(*blobs(args.samples, args.seed))
    # each rank its share of one shuffled order
    sampler: DistributedSampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(mlp(args.seed).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        # TODO(set-epoch): print list(sampler)[:8] here on each rank: each epoch gets the same order. The sampler
        # shuffles with a seed and the epoch it was last told, and nothing ever tells it which epoch this is.
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} last batch loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="samples per step on each rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the data and the shuffle")
    main(parser.parse_args())
