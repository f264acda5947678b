"""Train ResNet-18 on CIFAR-10 on one device: the baseline that ddp_torchrun.py distributes.

    python examples/single_device.py --data data --epochs 20 --batch-size 512 --lr 0.2
    python examples/single_device.py --synthetic 2048 --epochs 2 --batch-size 64   # no data set needed

`diff -u examples/single_device.py examples/ddp_torchrun.py` is every change DDP needs.
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's per-channel statistics


def build_model() -> nn.Module:
    # torchvision's ImageNet stem (7x7 stride-2 convolution, then max-pool) would shrink a 32x32 image
    # to 8x8 before the first block; the CIFAR variant uses a 3x3 stride-1 stem and no max-pool.
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's own
    model.maxpool = nn.Identity()
    return model


def synthetic_cifar(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-shaped uint8 images, learnable but not at once: each class a smooth colour pattern, each image
    its class's pattern at a random contrast under noise. (Random labels would give a loss that cannot fall.)"""
    g = torch.Generator().manual_seed(seed)
    patterns = F.interpolate(torch.rand(10, 3, 4, 4, generator=g) * 2 - 1, size=(32, 32), mode="bilinear")
    labels = torch.randint(0, 10, (count,), generator=g)
    contrast = torch.rand(count, 1, 1, 1, generator=g)
    noise = torch.randn(count, 3, 32, 32, generator=g)
    images = 128 + 64 * (contrast * patterns[labels] + 0.5 * noise)
    return images.round().clamp(0, 255).to(torch.uint8), labels


def load_dataset(data_dir: str | None, synthetic: int, seed: int):
    if data_dir:  # the real thing; `lab data prepare --root DIR` downloads it (this script never does)
        transform = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
        return torchvision.datasets.CIFAR10(data_dir, train=True, download=False, transform=transform)
    images, labels = synthetic_cifar(synthetic, seed)
    return TensorDataset(T.Normalize(MEAN, STD)(images / 255), labels)


def prepare_dataloader(dataset, batch_size: int, shuffle: bool) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, pin_memory=torch.cuda.is_available())


class Trainer:
    def __init__(self, model, train_data, optimizer, device, save_every: int, checkpoint_path: str | None):
        self.model = model.to(device)
        self.train_data, self.optimizer, self.device = train_data, optimizer, device
        self.save_every, self.checkpoint_path = save_every, checkpoint_path
        self.epochs_run = 0
        self.losses: list[dict[str, float]] = []  # {"step", "loss"} of every step run, for --losses
        if checkpoint_path and os.path.exists(checkpoint_path):
            self._load_checkpoint(checkpoint_path)

    def _load_checkpoint(self, path: str):
        checkpoint = torch.load(path, map_location=self.device)
        self.model.load_state_dict(checkpoint["model"])
        # The momentum buffers too: without them a resumed run takes different steps than one never stopped.
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.epochs_run = checkpoint["epochs_run"]
        print(f"resumed from epoch {self.epochs_run} ({path})")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch: int):
        for i, (source, targets) in enumerate(self.train_data):
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
            step = epoch * len(self.train_data) + i + 1
            loss = loss.item()
            self.losses.append({"step": step, "loss": loss})
            print(f"epoch {epoch} step {step} loss {loss:.6f}")

    def _save_checkpoint(self, epoch: int):
        path = self.checkpoint_path
        assert path is not None  # train() saves only when there is a checkpoint path
        checkpoint = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epochs_run": epoch + 1,
        }
        # A temporary file, then a rename: a run killed mid-write leaves the previous checkpoint whole.
        tmp = path + ".tmp"
        torch.save(checkpoint, tmp)
        os.replace(tmp, path)
        print(f"epoch {epoch} saved checkpoint {path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.checkpoint_path and (epoch + 1) % self.save_every == 0:
                self._save_checkpoint(epoch)


def main(args):
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(args.seed)
    dataset = load_dataset(args.data, args.synthetic, args.seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    train_data = prepare_dataloader(dataset, args.batch_size, shuffle=not args.no_shuffle)
    trainer = Trainer(model, train_data, optimizer, device, args.save_every, args.checkpoint)
    trainer.train(args.epochs)
    if args.losses:
        with open(args.losses, "w") as f:
            json.dump(trainer.losses, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory holding cifar-10-batches-py/ (default: synthetic data)")
    parser.add_argument("--synthetic", type=int, default=2048, help="synthetic images when there is no --data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="images per optimizer step")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--save-every", type=int, default=1, help="epochs between checkpoints")
    parser.add_argument("--checkpoint", help="checkpoint file: written every --save-every epochs, resumed if present")
    parser.add_argument("--losses", help="write every step's loss here as JSON")
    parser.add_argument("--no-shuffle", action="store_true", help="the same sample order every epoch")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the synthetic data and the order")
    main(parser.parse_args())
