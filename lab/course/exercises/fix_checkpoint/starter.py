"""Exercise `fix-checkpoint`: a checkpoint written by every rank at once, read too early, that will not load.

Run it as

    torchrun --standalone --nproc-per-node 2 exercises/fix_checkpoint.py --checkpoint /tmp/toy.pt

It trains a small classifier under DDP, writes the weights to --checkpoint, and then every rank restores them
into a fresh model, as a resumed run would, and reports its test loss. It fails, and it has two more mistakes
that happen not to fail here every time. Fix the three TODOs, then check it:
`lab exercise check fix-checkpoint` watches every torch.save and torch.load of every rank.
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
    sampler: DistributedSampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DDP(mlp(args.seed).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
            optimizer.step()

    # The checkpoint: the trained weights, for a later run to resume or evaluate, with or without torchrun.
    # TODO(checkpoint): every rank holds the same weights, and every rank writes them, to one file, at once.
    # TODO(checkpoint): these are the DDP wrapper's weights: each name starts with "module.", which the plain model
    # below does not know.
    torch.save(model.state_dict(), args.checkpoint)
    # TODO(checkpoint): once one rank writes the file, the others must not read it before it is whole.

    # Every rank restores it into a plain model, as a resumed or evaluating run would, and tests it.
    restored = mlp(args.seed).to(device)
    restored.load_state_dict(torch.load(args.checkpoint, map_location=device, weights_only=True))
    test_x, test_y = blobs(256, args.seed + 1)
    with torch.no_grad():
        test_loss = F.cross_entropy(restored(test_x.to(device)), test_y.to(device))
    print(f"rank {dist.get_rank()}: the restored model's test loss {test_loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="the file the trained weights are written to")
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="samples per step on each rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the data and the shuffle")
    main(parser.parse_args())
