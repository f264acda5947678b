"""Train ResNet-18 on CIFAR-10 with DistributedDataParallel: single_device.py in one process per device.

    torchrun --standalone --nproc-per-node 8 examples/ddp_torchrun.py --data data --epochs 20 --batch-size 512 --lr 0.2
    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --synthetic 2048   # CPU processes: gloo
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 examples/ddp_torchrun.py ...

Across nodes, --checkpoint must be on a file system that every node sees: global rank 0 writes it, all ranks read it.

`diff -u examples/single_device.py examples/ddp_torchrun.py` is every change DDP needs.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10's per-channel statistics


def ddp_setup() -> int:
    # torchrun starts one process per device, each with RANK, LOCAL_RANK (its device on this node),
    # WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; init_process_group reads them.
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)  # before NCCL starts, or every process would work on GPU 0
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return local_rank


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


def prepare_dataloader(dataset, batch_size: int, shuffle: bool, seed: int) -> DataLoader:
    # Rank r takes samples r, r + world_size, ... of one order all ranks share, so the ranks' k-th batches
    # make up one global batch. The sampler shuffles now, so the loader must not.
    sampler: DistributedSampler[int]  # it yields indices into the dataset: this rank's share of each epoch
    sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=torch.cuda.is_available())


class Trainer:
    def __init__(self, model, train_data, optimizer, device, save_every: int, checkpoint_path: str | None):
        self.model = model.to(device)
        self.train_data, self.optimizer, self.device = train_data, optimizer, device
        self.save_every, self.checkpoint_path = save_every, checkpoint_path
        self.epochs_run = 0
        self.losses: list[dict[str, float]] = []  # {"step", "loss"} of every step run, for --losses
        self.global_rank = dist.get_rank()
        if checkpoint_path and os.path.exists(checkpoint_path):
            self._load_checkpoint(checkpoint_path)  # on every rank, into the plain model
        self.model = DDP(self.model, device_ids=[device.index] if device.type == "cuda" else None)

    def _load_checkpoint(self, path: str):
        checkpoint = torch.load(path, map_location=self.device)  # onto this rank's device, not the saver's
        self.model.load_state_dict(checkpoint["model"])
        # The momentum buffers too: without them a resumed run takes different steps than one never stopped.
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.epochs_run = checkpoint["epochs_run"]
        if self.global_rank == 0:
            print(f"resumed from epoch {self.epochs_run} ({path})")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(source), targets)
        loss.backward()  # DDP averages the gradients over ranks here: every rank takes the same step
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch: int):
        self.train_data.sampler.set_epoch(epoch)  # else every epoch repeats the first one's order
        for i, (source, targets) in enumerate(self.train_data):
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
            step = epoch * len(self.train_data) + i + 1
            # Each rank's loss is over its share of the batch; their mean is the global batch's loss,
            # the number single_device.py prints. (gloo has no ReduceOp.AVG: sum, then divide.)
            dist.all_reduce(loss)
            loss = loss.item() / dist.get_world_size()
            self.losses.append({"step": step, "loss": loss})
            if self.global_rank == 0:
                print(f"epoch {epoch} step {step} loss {loss:.6f}")

    def _save_checkpoint(self, epoch: int):
        path = self.checkpoint_path
        assert path is not None  # train() saves only when there is a checkpoint path
        # All ranks hold the same weights, so one writes them; .module, the model inside DDP, has keys
        # without a "module." prefix, so the file loads into a plain model at any world size.
        checkpoint = {
            "model": self.model.module.state_dict(),
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
                if self.global_rank == 0:
                    self._save_checkpoint(epoch)
                dist.barrier()  # no rank runs on before the checkpoint is on disk


def main(args):
    local_rank = ddp_setup()
    world_size = dist.get_world_size()
    if args.batch_size % world_size:
        raise SystemExit(f"--batch-size {args.batch_size} does not split evenly over {world_size} ranks")
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(args.seed)  # the same on every rank: the same synthetic data and initial weights
    dataset = load_dataset(args.data, args.synthetic, args.seed)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    # --batch-size is the global batch, as in single_device.py; each rank takes its share.
    train_data = prepare_dataloader(dataset, args.batch_size // world_size, not args.no_shuffle, args.seed)
    trainer = Trainer(model, train_data, optimizer, device, args.save_every, args.checkpoint)
    trainer.train(args.epochs)
    if args.losses and dist.get_rank() == 0:
        with open(args.losses, "w") as f:
            json.dump(trainer.losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="directory holding cifar-10-batches-py/ (default: synthetic data)")
    parser.add_argument("--synthetic", type=int, default=2048, help="synthetic images when there is no --data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="images per optimizer step, over all ranks")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--save-every", type=int, default=1, help="epochs between checkpoints")
    parser.add_argument("--checkpoint", help="checkpoint file: written every --save-every epochs, resumed if present")
    parser.add_argument("--losses", help="write every step's loss here as JSON")
    parser.add_argument("--no-shuffle", action="store_true", help="the same sample order every epoch")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights, the synthetic data and the order")
    main(parser.parse_args())
