"""Exercise `fix-batchnorm`, the reference solution: every rank ends with the BatchNorm statistics of the global batch
(every rank's samples together), as one process with the whole batch would: SyncBatchNorm on GPUs, on the CPU a
BatchNorm that all-reduces its batch's sums.

torchrun --standalone --nproc-per-node 2 solution.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.nn.functional import all_reduce
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


class GlobalBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d whose training statistics are the global batch's, as SyncBatchNorm's (which runs on GPUs only):
    each forward all-reduces the per-channel sum, sum of squares and count. torch.distributed.nn's all_reduce is
    differentiable (its backward all-reduces the gradient), so every rank's input gets its share of the gradient
    through the global mean and variance, as SyncBatchNorm's backward gives it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        dims = [0, *range(2, x.dim())]  # every dimension but the channels
        channels = x.shape[1]
        count = x.new_full((1,), x.numel() // channels)
        total = all_reduce(torch.cat([x.sum(dims), (x * x).sum(dims), count]))  # SUM over the ranks
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels : 2 * channels] / n - mean * mean
        with torch.no_grad():  # the running statistics, as BatchNorm keeps them (momentum 0.1, its default)
            assert self.running_mean is not None and self.running_var is not None and self.momentum is not None
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * n / (n - 1), self.momentum)  # unbiased, as BatchNorm keeps it
        shape = [1, channels] + [1] * (x.dim() - 2)
        normed = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        return normed * self.weight.view(shape) + self.bias.view(shape)


def mlp(seed: int, norm: type[nn.Module] = nn.BatchNorm1d) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), norm(HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def main(args: argparse.Namespace) -> None:
    device = setup()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Each rank's shard holds some classes only, as when a data set is stored sorted, one class per file.
    groups = min(world_size, CLASSES)
    mine = [c for c in range(CLASSES) if c % groups == rank % groups]
    x, y = blobs(args.per_rank, args.seed + 10 + rank, mine)
    # The statistics of every rank's batch together: SyncBatchNorm on GPUs, the all-reduce above on the CPU.
    model = mlp(args.seed, norm=nn.BatchNorm1d if device.type == "cuda" else GlobalBatchNorm1d)
    if device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
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
