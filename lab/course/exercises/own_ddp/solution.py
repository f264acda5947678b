"""Exercise `own-ddp`, a reference solution: DistributedDataParallel written by hand.

    torchrun --standalone --nproc-per-node 2 solution.py --bucket-mb 0.3

MyDDP(module, bucket_mb) does what torch's DDP does for a model on one device:
- at construction it broadcasts every parameter from rank 0, so every rank starts from the same weights;
- it groups the parameters that get gradients into buckets of about bucket_mb MiB, in the reverse of the model's
  order (the backward produces the last layer's gradients first), and registers a hook on each parameter that runs
  when its gradient is accumulated;
- when a bucket's last gradient arrives, and every bucket before it has gone, the hook flattens the bucket's
  gradients into one tensor and launches its all-reduce asynchronously (async_op=True): the communication runs while
  the backward goes on computing the earlier layers' gradients;
- finish(), before the optimizer step, waits on every handle, divides by the world size (the mean of the ranks'
  gradients) and copies each bucket back into its parameters' .grad.

bucket_mb=0 gives each parameter an all-reduce of its own (the exercise's first stage).
"""

import argparse
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MIB = 1 << 20


class MyDDP(nn.Module):
    def __init__(self, module: nn.Module, bucket_mb: float = 0.0) -> None:
        super().__init__()
        self.module = module
        for p in module.parameters():  # every rank starts from rank 0's weights
            dist.broadcast(p.data, src=0)
        cap = bucket_mb * MIB
        trainable = [p for p in module.parameters() if p.requires_grad]  # a frozen layer has no gradient
        self.buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(trainable):  # the order the backward makes their gradients
            nbytes = p.numel() * p.element_size()
            if not self.buckets or size + nbytes > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.bucket_of: dict[torch.Tensor, int] = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        for p in trainable:
            p.register_post_accumulate_grad_hook(self._gradient_ready)
        self._reset()

    def _reset(self) -> None:
        self.ready = [0] * len(self.buckets)  # gradients arrived in each bucket this backward
        self.next_bucket = 0  # buckets go in order: every rank launches the same all-reduces in the same order
        self.handles: list[tuple[dist.Work, torch.Tensor, int]] = []

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    def _gradient_ready(self, p: torch.Tensor) -> None:
        self.ready[self.bucket_of[p]] += 1
        while self.next_bucket < len(self.buckets) and self.ready[self.next_bucket] == len(
            self.buckets[self.next_bucket]
        ):
            i = self.next_bucket
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i] if q.grad is not None])
            self.handles.append((dist.all_reduce(flat, async_op=True), flat, i))
            self.next_bucket += 1

    def finish(self) -> None:
        """Before the optimizer step: every bucket's all-reduce done, averaged and back in the gradients."""
        world = dist.get_world_size()
        for handle, flat, i in self.handles:
            handle.wait()
            flat.div_(world)
            offset = 0
            for q in self.buckets[i]:
                if q.grad is not None:
                    q.grad.copy_(flat[offset : offset + q.numel()].view_as(q))
                offset += q.numel()
        self._reset()


def build_model() -> nn.Module:
    """Three hidden layers on a frozen input layer (a pretrained embedding kept fixed: no gradient)."""
    model = nn.Sequential(
        nn.Linear(32, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )
    model[0].requires_grad_(False)
    return model


def ddp_setup() -> torch.device:
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def main(args: argparse.Namespace) -> None:
    device = ddp_setup()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)  # each rank other weights: MyDDP must broadcast rank 0's
    model = MyDDP(build_model().to(device), args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        inputs = torch.randn(8 * world, 32, generator=data)
        targets = torch.randint(0, 10, (8 * world,), generator=data)
        mine = slice(8 * rank, 8 * (rank + 1))
        loss = F.cross_entropy(model(inputs[mine].to(device)), targets[mine].to(device))
        loss.backward()
        model.finish()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}, {len(model.buckets)} buckets")
    sums = torch.stack([p.detach().sum() for p in model.parameters()])
    everyone = [torch.zeros_like(sums) for _ in range(world)]
    dist.all_gather(everyone, sums)
    if rank == 0:
        same = all(torch.equal(everyone[0], s) for s in everyone)
        print("the ranks' weights", "agree" if same else "DIFFER", f"({world} ranks)")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket-mb", type=float, default=0.3, help="MiB a bucket (0: one all-reduce a parameter)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
