"""Data for the lab: real CIFAR-10 or synthetic CIFAR-shaped images, resident on the device.

dataset = data.load(cfg.data)            # cifar10 when found, else synthetic
print(dataset.description)               # which one, always said

This module's own names are torch-free: `lab train --nproc-per-node` and `lab launch` check a run's data here
before any process of the run imports torch (about 1.2 s of a core, saved in the launching process). Dataset, load,
from_files, write_synthetic (lab.run.data.dataset) and DeviceLoader (lab.run.data.loader) import torch, on first use
(PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lab.errors import DataError
from lab.run.config import DataConfig
from lab.run.data import layout

if TYPE_CHECKING:
    from lab.run.data.dataset import Dataset, from_files, load, write_synthetic
    from lab.run.data.loader import DeviceLoader

__all__ = ["Dataset", "DeviceLoader", "check_source", "generated_train_size", "load", "from_files", "write_synthetic"]

SYNTHETIC_MARK = "lab_synthetic_seed"  # key in batches.meta of files written by `lab data synth`

# name -> the submodule that holds it (and imports torch)
_WITH_TORCH = {
    "Dataset": "dataset",
    "load": "dataset",
    "from_files": "dataset",
    "write_synthetic": "dataset",
    "DeviceLoader": "loader",
}


def __getattr__(name: str) -> Any:
    if name in _WITH_TORCH:
        return getattr(importlib.import_module(f"lab.run.data.{_WITH_TORCH[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_source(cfg: DataConfig) -> None:
    """Refuse data.source=cifar10 without its files; cheap, so launchers call it before starting processes."""
    if cfg.source == "cifar10" and not layout.present(cfg.root):
        raise DataError(
            f"data.root: no CIFAR-10 under {layout.folder(cfg.root)}; run "
            f"`lab data prepare --root {cfg.root}` or set data.source=synthetic"
        )


def reads_files(cfg: DataConfig) -> bool:
    return cfg.source == "cifar10" or (cfg.source == "auto" and layout.present(cfg.root))


def generated_train_size(cfg: DataConfig) -> int | None:
    """The training set's size when load() will generate it (known without loading), else None."""
    return None if reads_files(cfg) else cfg.synthetic_train_size
