"""Exercise `accumulate`: gradient accumulation under DDP, one all-reduce per optimizer step.

A batch too large for the memory of one device can still be trained: run it as K micro-batches, let their
gradients add up in .grad, and step the optimizer once after the K-th. This script does that already, but not
the way it should under DDP:

- DDP all-reduces the gradients in every backward, so it talks K times per optimizer step where once would do:
  run every micro-batch but the last inside `with model.no_sync():`, and DDP keeps those gradients local and
  all-reduces their sum once, in the last backward;
- each loss is its micro-batch's mean, so K backward passes add up K means: K times the large batch's gradient,
  a learning rate K times too large.

Do the two TODO(accumulate), run it

    torchrun --standalone --nproc-per-node 2 exercises/accumulate.py --accumulate 4

and check it: `lab exercise check accumulate`. The check runs it on 2 ranks with its own sizes,
counts DDP's all-reduces between optimizer steps, and compares the final weights with one process trained on the
large batch (micro-batch x K x ranks samples a step). Keep the options, the model, the data and the seed.
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


def ddp_setup() -> torch.device:
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def synthetic_data(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten classes, each a point in 32 dimensions, the samples scattered round it."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 32, generator=g)
    labels = torch.randint(0, 10, (count,), generator=g)
    return centres[labels] + 1.5 * torch.randn(count, 32, generator=g), labels


def train(
    model: DDP, loader: DataLoader, optimizer: torch.optim.Optimizer, device: torch.device, accumulate: int, epochs: int
) -> None:
    sampler = loader.sampler
    assert isinstance(sampler, DistributedSampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for i, (inputs, targets) in enumerate(loader):
            last = (i + 1) % accumulate == 0  # the micro-batch that ends an optimizer step
            # TODO(accumulate): DDP all-reduces in every backward; before the last micro-batch it need not (no_sync)
            loss = F.cross_entropy(model(inputs.to(device)), targets.to(device))
            # TODO(accumulate): the K backward passes add up K micro-batch means, not one large batch's mean
            loss.backward()
            if last:
                optimizer.step()
                optimizer.zero_grad()
                if dist.get_rank() == 0:
                    print(f"epoch {epoch} step {(i + 1) // accumulate} loss {loss.item():.6f}")


def main(args: argparse.Namespace) -> None:
    device = ddp_setup()
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    inputs, labels = synthetic_data(args.samples, args.seed)
    dataset = TensorDataset(inputs, labels)
    sampler: DistributedSampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.micro_batch, sampler=sampler)
    model = DDP(build_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train(model, loader, optimizer, device, args.accumulate, args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per rank per forward and backward")
    parser.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step (K)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the data and its order")
    main(parser.parse_args())
