"""Exercise `convert`, the reference solution: the starter data-parallel with DDP under torchrun.

torchrun --standalone --nproc-per-node 2 solution.py --epochs 2
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

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's per-channel statistics


def ddp_setup() -> torch.device:
    local_rank = int(os.environ["LOCAL_RANK"])  # torchrun sets it, with RANK, WORLD_SIZE, MASTER_ADDR/PORT
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before NCCL starts, or every process works on GPU 0
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


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


def prepare_dataloader(dataset: TensorDataset, batch_size: int, shuffle: bool, seed: int) -> DataLoader:
    sampler: DistributedSampler[int] = DistributedSampler(dataset, shuffle=shuffle, seed=seed)  # a share of one order
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


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
        self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _load_checkpoint(self, path: str) -> None:
        checkpoint = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.epochs_run = checkpoint["epochs_run"]
        if dist.get_rank() == 0:
            print(f"resumed from epoch {self.epochs_run} ({path})")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch: int) -> None:
        assert isinstance(self.train_data.sampler, DistributedSampler)  # prepare_dataloader's
        self.train_data.sampler.set_epoch(epoch)  # else every epoch repeats the first one's order
        for i, (source, targets) in enumerate(self.train_data):
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
            step = epoch * len(self.train_data) + i + 1
            dist.all_reduce(loss)  # the mean of the ranks' losses: sum, then divide (older gloo has no AVG)
            if dist.get_rank() == 0:
                print(f"epoch {epoch} step {step} loss {loss.item() / dist.get_world_size():.6f}")

    def _save_checkpoint(self, epoch: int) -> None:
        path = self.checkpoint_path
        assert path is not None
        assert isinstance(self.model.module, nn.Module)  # the model inside DDP: its keys have no "module." prefix
        checkpoint = {
            "model": self.model.module.state_dict(),
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
                if dist.get_rank() == 0:  # every rank holds the same weights: one writer
                    self._save_checkpoint(epoch)
                dist.barrier()  # no rank runs on before the checkpoint is on disk


def main(args: argparse.Namespace) -> None:
    device = ddp_setup()
    torch.manual_seed(args.seed)
    images, labels = synthetic_cifar(args.synthetic, args.seed)
    dataset = TensorDataset(images, labels)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train_data = prepare_dataloader(dataset, args.batch_size // dist.get_world_size(), not args.no_shuffle, args.seed)
    trainer = Trainer(model, train_data, optimizer, device, args.save_every, args.checkpoint)
    trainer.train(args.epochs)
    dist.destroy_process_group()


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
