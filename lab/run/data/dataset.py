"""The data set in memory: its four tensors, loaded from CIFAR-10's files or generated, and what it is, said.

dataset = load(cfg.data)                 # cifar10 when found, else synthetic
print(dataset.description)               # which one, always said
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lab.errors import DataError
from lab.run.config import DataConfig
from lab.run.data import SYNTHETIC_MARK, check_source, cifar, layout, reads_files, synthetic


@dataclass(frozen=True)
class Dataset:
    train_images: torch.Tensor  # uint8, N x 3 x 32 x 32
    train_labels: torch.Tensor  # int64, N
    test_images: torch.Tensor
    test_labels: torch.Tensor
    source: str  # "cifar10" or "synthetic": what the model learned from, said everywhere
    description: str

    def to(self, device: torch.device) -> Dataset:
        move = {k: getattr(self, k).to(device) for k in ("train_images", "train_labels", "test_images", "test_labels")}
        return Dataset(**move, source=self.source, description=self.description)


def load(cfg: DataConfig) -> Dataset:
    check_source(cfg)
    if reads_files(cfg):
        return from_files(cfg.root)
    train = synthetic.generate(cfg.synthetic_train_size, cfg.synthetic_seed, "train")
    test = synthetic.generate(cfg.synthetic_test_size, cfg.synthetic_seed, "test")
    return Dataset(
        *train,
        *test,
        source="synthetic",
        description=f"synthetic CIFAR-shaped data (seed {cfg.synthetic_seed}, "
        f"{len(train[1])} train / {len(test[1])} test images, generated)",
    )


def from_files(root: str | Path) -> Dataset:
    train_images, train_labels, test_images, test_labels, meta = cifar.read(root)
    where = layout.folder(root)
    counts = f"{len(train_labels)} train / {len(test_labels)} test images"
    if SYNTHETIC_MARK in meta:
        return Dataset(
            train_images,
            train_labels,
            test_images,
            test_labels,
            "synthetic",
            f"synthetic CIFAR-shaped data (seed {meta[SYNTHETIC_MARK]}, {counts}, files in {where})",
        )
    return Dataset(train_images, train_labels, test_images, test_labels, "cifar10", f"CIFAR-10 ({counts}, {where})")


def write_synthetic(root: str | Path, train_size: int, test_size: int, seed: int) -> Path:
    """`lab data synth`: synthetic data in the CIFAR-10 layout, marked as synthetic."""
    if layout.present(root):
        existing = from_files(root)
        if existing.source == "cifar10":
            raise DataError(f"{layout.folder(root)}: holds real CIFAR-10; refusing to overwrite it with synthetic data")
    return cifar.write(
        root,
        synthetic.generate(train_size, seed, "train"),
        synthetic.generate(test_size, seed, "test"),
        {SYNTHETIC_MARK: seed},
    )
