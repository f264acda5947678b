"""The `accumulate` check's reference: the same model, data and seed trained in one process on the large batch
(micro-batch x K x ranks samples an optimizer step), no accumulation. Its final weights are what K accumulated
micro-batches on every rank must reach.

    python reference.py --batch-size 64

It takes the samples in the order the learner's ranks take them together: DistributedSampler's permutation
(seed + epoch), which each rank strides through (rank, rank + world, ...), so the micro-batches of one optimizer
step on all ranks are one contiguous slice of it, the slice this process takes as its batch. The model is wrapped
in DDP on a world of one (an in-memory store, no torchrun) only so that the grader records its weights as it
records the learner's. It runs on the CPU whatever the learner's device.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model() -> nn.Module:  # the starter's
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def synthetic_data(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:  # the starter's
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 32, generator=g)
    labels = torch.randint(0, 10, (count,), generator=g)
    return centres[labels] + 1.5 * torch.randn(count, 32, generator=g), labels


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(args.seed)
    inputs, labels = synthetic_data(args.samples, args.seed)
    dataset = TensorDataset(inputs, labels)
    sampler: DistributedSampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs_batch, targets in loader:
            loss = F.cross_entropy(model(inputs_batch), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64, help="samples per optimizer step")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
