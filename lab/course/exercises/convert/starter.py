"""Exercise `convert`: make this single-device training script data-parallel with DDP under torchrun.

It is examples/single_device.py with a small CNN in place of ResNet-18, so the check runs in seconds on a CPU.
It runs as it is, on one device:

    python convert.py --epochs 2

Make it run as

    torchrun --standalone --nproc-per-node 2 exercises/convert.py --epochs 2

with every TODO(ddp) done, then check it: `lab exercise check convert`. The check runs it on 2 and on
3 ranks with its own sizes and seeds and measures what each rank did. Keep the command-line options as they are:
the check passes them. --batch-size stays the global batch (images per optimizer step, over all ranks).
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# TODO(ddp): import torch.distributed, DistributedDataParallel and DistributedSampler

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's per-channel statistics


# TODO(ddp): a setup function: torchrun sets LOCAL_RANK (this process's device on the node), RANK and
# WORLD_SIZE; choose the device from LOCAL_RANK (torch.cuda.set_device on a GPU) and init_process_group
# (nccl on GPUs, gloo on the CPU).


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),  # the classes differ by where their colours are, so keep a 4x4 map
        nn.Flatten(),
        nn.Linear(32 * 16, 10),
    )


def synthetic_cifar(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-shaped images, learnable but not at once: each class a smooth colour pattern under noise."""
    g = torch.Generator().manual_seed(seed)
    patterns = F.interpolate(torch.rand(10, 3, 4, 4, generator=g) * 2 - 1, size=(32, 32), mode="bilinear")
    labels = torch.randint(0, 10, (count,), generator=g)
    contrast = torch.rand(count, 1, 1, 1, generator=g)
    noise = torch.randn(count, 3, 32, 32, generator=g)
    images = (128 + 64 * (contrast * patterns[labels] + 0.2 * noise)).round().clamp(0, 255) / 255
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return (images - mean) / std, labels


def prepare_dataloader(dataset: TensorDataset, batch_size: int, shuffle: bool) -> DataLoader:
    # TODO(ddp): each rank must read its own share of every epoch: a DistributedSampler (which then
    # shuffles, so the loader must not)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        save_every: int,
        checkpoint_path: str | None,
    ) -> None:
        self.model = model.to(device)
        self.train_data, self.optimizer, self.device = train_data, optimizer, device
        self.save_every, self.checkpoint_path = save_every, checkpoint_path
        self.epochs_run = 0
        if checkpoint_path and os.path.exists(checkpoint_path):
            self._load_checkpoint(checkpoint_path)
        # TODO(ddp): wrap the model in DistributedDataParallel (after loading the checkpoint into the plain model)

    def _load_checkpoint(self, path: str) -> None:
        checkpoint = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.epochs_run = checkpoint["epochs_run"]
        print(f"resumed from epoch {self.epochs_run} ({path})")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch: int) -> None:
        # TODO(ddp): the sampler must know the epoch, or every epoch repeats the first one's order
        for i, (source, targets) in enumerate(self.train_data):
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
            step = epoch * len(self.train_data) + i + 1
            # TODO(ddp): this is this rank's loss only; print the global batch's (the mean over ranks), once
            print(f"epoch {epoch} step {step} loss {loss.item():.6f}")

    def _save_checkpoint(self, epoch: int) -> None:
        path = self.checkpoint_path
        assert path is not None
        # TODO(ddp): the file must load into the plain model (no "module." prefix on its keys)
        checkpoint = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epochs_run": epoch + 1,
        }
        tmp = path + ".tmp"
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)  # a run killed mid-write leaves the previous checkpoint whole

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.checkpoint_path and (epoch + 1) % self.save_every == 0:
                # TODO(ddp): every rank holds the same weights: one rank writes, no rank runs on before it is written
                self._save_checkpoint(epoch)


def main(args: argparse.Namespace) -> None:
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(args.seed)
    images, labels = synthetic_cifar(args.synthetic, args.seed)
    dataset = TensorDataset(images, labels)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # TODO(ddp): --batch-size is the global batch: each rank takes its share
    train_data = prepare_dataloader(dataset, args.batch_size, shuffle=not args.no_shuffle)
    trainer = Trainer(model, train_data, optimizer, device, args.save_every, args.checkpoint)
    trainer.train(args.epochs)
    # TODO(ddp): end the process group


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", type=int, default=192, help="synthetic images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=24, help="images per optimizer step, over all ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=1, help="epochs between checkpoints")
    parser.add_argument("--checkpoint", help="checkpoint file: written every --save-every epochs, resumed if present")
    parser.add_argument("--no-shuffle", action="store_true", help="the same sample order every epoch")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the synthetic data and the order")
    main(parser.parse_args())
