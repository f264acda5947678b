"""Exercise `shard`: train this DDP model under FSDP2's fully_shard instead, and hold half the model state.

Under DDP every rank holds the whole model: its parameters, their gradients and the optimizer's state (AdamW: two
more tensors the size of the parameters), four copies of the weights on every rank. fully_shard (FSDP2) leaves
each rank 1/N of each: a unit's parameters are all-gathered just before it computes and freed after, its
gradients reduce-scattered so each rank keeps the part of them it updates. The training itself does not change:
the same loss at every step as DDP's, up to float rounding.

Do the TODO(shard), run it

    torchrun --standalone --nproc-per-node 2 exercises/shard.py

and check it: `lab exercise check shard`. The check runs it and this script's DDP twin on 2 ranks and
compares what every rank did: fully_shard's calls, the bytes of model state each rank holds at each optimizer
step, and the loss at each step. Keep the options, the model, the data, the optimizer and the seed.
(fully_shard is public in torch.distributed.fsdp from torch 2.6; on torch 2.6 it needs GPUs.)
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP  # TODO(shard): fully_shard, from torch.distributed.fsdp
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


def main(args: argparse.Namespace) -> None:
    device = setup()
    torch.manual_seed(args.seed)
    inputs, labels = synthetic_data(args.samples, args.seed)
    dataset = TensorDataset(inputs, labels)
    sampler: DistributedSampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size // dist.get_world_size(), sampler=sampler)
    # TODO(shard): fully_shard each Linear (a unit each: gathered just before it computes), then the whole
    # model (the root), in place of DDP. The optimizer after: fully_shard replaces the parameters it is given.
    model = DDP(build_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
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
