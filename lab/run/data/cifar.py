"""CIFAR-10 in torchvision's folder layout (`cifar-10-batches-py/`): read, write, download.

The files are Python pickles. They are read with an unpickler that only builds
numpy arrays and plain containers, so a planted file cannot run code.
"""

from __future__ import annotations

import codecs
import importlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab import atomic
from lab.errors import DataError
from lab.run.data.layout import ARCHIVE, CLASSES, IMAGE_SHAPE, META_FILE, NUM_CLASSES, TEST_FILE, TRAIN_FILES, folder

# Through importlib: two `from ... import _reconstruct` lines, one per numpy, are a redefinition to mypy.
try:  # numpy >= 2
    _multiarray = importlib.import_module("numpy._core.multiarray")
except ImportError:  # pragma: no cover - numpy 1.x
    _multiarray = importlib.import_module("numpy.core.multiarray")
_reconstruct = _multiarray._reconstruct

# The only globals a CIFAR-10 pickle needs (py2-era numpy wrote numpy.core; numpy 2 writes numpy._core).
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,  # protocol-2 pickles written by Python 3 encode bytes this way
}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}") from None


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            obj = _ArraysOnly(f, encoding="latin1").load()
    except FileNotFoundError:
        raise DataError(
            f"{path}: missing; run `lab data prepare --root {path.parent.parent}` or use data.source=synthetic"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise DataError(
            f"{path}: truncated or not a CIFAR-10 batch file ({type(exc).__name__}: {exc}); "
            f"delete it and run `lab data prepare`"
        ) from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def read_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch file as (images uint8 N x 3 x 32 x 32, labels int64 N)."""
    obj = _unpickle(path)
    if "data" not in obj or "labels" not in obj:
        raise DataError(f"{path}: keys 'data' and 'labels' expected, found {sorted(map(str, obj))}")
    data, labels = obj["data"], np.asarray(obj["labels"])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = getattr(data, "shape", None)
        dtype = getattr(data, "dtype", type(data).__name__)
        raise DataError(f"{path}: data has shape {shape} and type {dtype}; expected (N, 3072) uint8")
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: labels have shape {labels.shape}; expected {data.shape[0]} integers")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{path}: labels range over [{labels.min()}, {labels.max()}]; expected 0..{NUM_CLASSES - 1}")
    images = torch.from_numpy(data.reshape(-1, *IMAGE_SHAPE).copy())
    return images, torch.from_numpy(labels.astype(np.int64))


def read(root: str | Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(train images, train labels, test images, test labels, meta) from `root`/cifar-10-batches-py."""
    base = folder(root)
    parts = [read_batch(base / name) for name in TRAIN_FILES]
    test_images, test_labels = read_batch(base / TEST_FILE)
    meta = _unpickle(base / META_FILE) if (base / META_FILE).exists() else {}
    train_images = torch.cat([p[0] for p in parts])
    train_labels = torch.cat([p[1] for p in parts])
    return train_images, train_labels, test_images, test_labels, meta


def write(
    root: str | Path, train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], meta: dict
) -> Path:
    """Write images in the CIFAR-10 layout (five train batches, one test batch, meta)."""
    base = folder(root)
    base.mkdir(parents=True, exist_ok=True)
    images, labels = train
    for name, idx in zip(TRAIN_FILES, torch.arange(len(labels)).chunk(len(TRAIN_FILES))):
        _write_batch(base / name, images[idx], labels[idx], name)
    _write_batch(base / TEST_FILE, *test, TEST_FILE)
    _atomic_pickle(base / META_FILE, {"label_names": list(CLASSES), "num_vis": 3072, **meta})
    return base


def _write_batch(path: Path, images: torch.Tensor, labels: torch.Tensor, name: str) -> None:
    _atomic_pickle(
        path, {"batch_label": name, "labels": labels.tolist(), "data": images.reshape(len(images), -1).numpy()}
    )


def _atomic_pickle(path: Path, obj: dict) -> None:
    atomic.write_bytes(path, pickle.dumps(obj, protocol=4), durable=True)


def download(root: str | Path) -> Path:
    """Fetch and verify CIFAR-10 with torchvision (md5 of the archive and of every file).

    Where there is no internet, an archive copied into `root` by hand is verified and used.
    """
    from torchvision.datasets import CIFAR10

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    try:
        CIFAR10(str(root), train=True, download=True)
        CIFAR10(str(root), train=False, download=True)
    except (OSError, RuntimeError) as exc:  # URLError is an OSError
        reason = str(getattr(exc, "reason", exc)).splitlines()[0]
        raise DataError(
            f"{root}: could not download CIFAR-10 ({reason}); copy {ARCHIVE} into {root} "
            f"and run again, or train on data.source=synthetic"
        ) from None
    read(root)  # the files must also pass the lab's own checks
    return folder(root)
