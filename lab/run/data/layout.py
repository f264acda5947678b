"""CIFAR-10's folder layout (torchvision's `cifar-10-batches-py/`), torch-free: a launcher checks where a run's data
is before any of its processes imports torch (lab.run.data.check_source); lab.run.data.cifar reads and writes it.

>>> present("/nonexistent"), folder("data").as_posix()
(False, 'data/cifar-10-batches-py')
"""

from __future__ import annotations

from pathlib import Path

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
ARCHIVE = "cifar-10-python.tar.gz"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
NUM_CLASSES = len(CLASSES)
IMAGE_SHAPE = (3, 32, 32)
TRAIN_SIZE = 50_000  # images in the five training batches


def folder(root: str | Path) -> Path:
    return Path(root) / FOLDER


def present(root: str | Path) -> bool:
    """True when the data set's folder exists under `root` (its files are checked on load)."""
    return (folder(root) / TRAIN_FILES[0]).exists()
