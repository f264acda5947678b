"""Exercise `own-ddp`: write DistributedDataParallel yourself, and see its communication overlap the backward.

torch's DDP does four things, and here you write each of them in MyDDP(module, bucket_mb):
- at construction, broadcast every parameter from rank 0 (dist.broadcast(p.data, src=0)): the ranks must start
  from the same weights, or their "average" gradient is an average of different models' gradients;
- group the parameters that get gradients (requires_grad: the model's first layer is frozen and has none) into
  buckets of about bucket_mb MiB, in the reverse of module.parameters()'s order: the backward makes the last
  layer's gradients first, so that bucket is ready first. Start a new bucket when the next parameter would not fit;
  bucket_mb=0 gives every parameter a bucket of its own (stage 1);
- register a hook on each of those parameters (p.register_post_accumulate_grad_hook(fn): fn(p) runs when p.grad
  is complete). When a bucket's last gradient is in, and every bucket before it has gone (every rank must launch the
  same all-reduces in the same order), flatten its gradients (torch.cat of each .grad.reshape(-1)) and launch
  dist.all_reduce(flat, async_op=True). Keep the handle: do not wait here, or the backward waits for the network;
- finish(), called after loss.backward() and before optimizer.step(): wait on every handle, divide by the world
  size, copy each bucket back into its parameters' .grad, and get ready for the next backward.

Stage 1 (bucket_mb=0, one all-reduce a parameter), then stage 2 (buckets). Try it

    torchrun --standalone --nproc-per-node 2 exercises/own_ddp.py --bucket-mb 0.3

and check it: `lab exercise check own-ddp`. The check builds its own model, gives every rank other weights,
runs 3 steps with bucket_mb=0 and 3 with 0.3 on 2, 3 and 4 ranks, and measures from outside your code: the weights
against one process on the whole batch, that rank 0's weights reached every rank, the all-reduces a step against
the buckets 0.3 MiB makes, how many of them were launched while the backward was still computing (the overlap), and
your step time beside torch's DDP on the same model. Keep MyDDP's name and arguments, forward() and finish().
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
        # TODO(own-ddp): broadcast every parameter from rank 0.
        # TODO(own-ddp): the parameters with requires_grad, in reversed order, into buckets of bucket_mb * MIB
        # bytes at most (p.numel() * p.element_size() each; a new bucket when the next would not fit).
        # TODO(own-ddp): p.register_post_accumulate_grad_hook(self._gradient_ready) on each of them.
        self._reset()

    def _reset(self) -> None:
        # TODO(own-ddp): what one backward keeps: gradients in per bucket, the next bucket to launch, the handles.
        pass

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    def _gradient_ready(self, p: torch.Tensor) -> None:
        # TODO(own-ddp): count p in its bucket; launch every full bucket in order, from the next one not launched:
        # flat = torch.cat of its gradients' .reshape(-1); dist.all_reduce(flat, async_op=True); keep the handle.
        pass

    def finish(self) -> None:
        """Before the optimizer step: every bucket's all-reduce done, averaged and back in the gradients."""
        # TODO(own-ddp): wait on each handle, divide by dist.get_world_size(), copy back into each .grad.
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
            print(f"step {step} loss {loss.item():.4f}")
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
