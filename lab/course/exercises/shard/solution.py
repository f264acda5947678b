"""Exercise `shard`, the reference solution: the model under FSDP2's fully_shard, each Linear a unit of its own
and the root last; the optimizer built after, on the sharded parameters.

torchrun --standalone --nproc-per-node 2 solution.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup() -> torch.device:
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def build_model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def synthetic_data(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten classes, each a point in 64 dimensions, the samples scattered round it."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 64, generator=g)
    labels = torch.randint(0, 10, (count,), generator=g)
    return centres[labels] + 2.0 * torch.randn(count, 64, generator=g), labels


def shard(model: nn.Sequential) -> nn.Module:
    """Each Linear its own unit (its parameters gathered just before it computes, freed after), then the root,
    which takes what is left and lets FSDP schedule the units' gathers and reduce-scatters together."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def main(args: argparse.Namespace) -> None:
    device = setup()
    torch.manual_seed(args.seed)  # the same initial weights on every rank: each then keeps its shard of them
    inputs, labels = synthetic_data(args.samples, args.seed)
    dataset = TensorDataset(inputs, labels)
    sampler: DistributedSampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size // dist.get_world_size(), sampler=sampler)
    model = shard(build_model().to(device))
    # After fully_shard: it replaced each parameter with its sharded DTensor, and the optimizer must hold those
    # (its state, Adam's two moments, is then sharded too).
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if dist.get_rank() == 0:
                print(f"epoch {epoch} step {step + 1} loss {loss.item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per optimizer step, over all ranks")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the data and its order")
    main(parser.parse_args())
