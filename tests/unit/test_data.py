"""Real-layout CIFAR-10 files and synthetic data: read, write, detect, refuse what is broken."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from lab.errors import DataError
from lab.run import data
from lab.run.config import DataConfig
from lab.run.data import cifar, synthetic


@pytest.fixture
def synth_root(tmp_path):
    data.write_synthetic(tmp_path, train_size=100, test_size=20, seed=3)
    return tmp_path


def test_synthetic_is_deterministic_balanced_and_seed_dependent():
    a, la = synthetic.generate(200, seed=1, split="train")
    b, lb = synthetic.generate(200, seed=1, split="train")
    c, _ = synthetic.generate(200, seed=2, split="train")
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, c)
    assert la.bincount().tolist() == [20] * 10


def test_synthetic_classes_are_separable_by_their_patterns():
    # Nearest class pattern already beats chance by far: the data set carries class structure.
    images, labels = synthetic.generate(1000, seed=0, split="test")
    patterns = synthetic.class_patterns(0).flatten(1)
    x = (images.float() - 128).flatten(1)
    predicted = (x @ patterns.T / patterns.norm(dim=1)).argmax(dim=1)
    assert (predicted == labels).float().mean() > 0.3


def test_written_synthetic_files_round_trip_and_say_they_are_synthetic(synth_root):
    ds = data.load(DataConfig(source="auto", root=str(synth_root)))
    assert ds.source == "synthetic" and "files in" in ds.description
    expected, labels = synthetic.generate(100, seed=3, split="train")
    assert torch.equal(ds.train_images, expected) and torch.equal(ds.train_labels, labels)
    assert len(ds.test_labels) == 20


def test_real_layout_is_read_as_cifar10(tmp_path):
    # Same files as torchvision's layout, without the synthetic mark: what real CIFAR-10 looks like to the lab.
    images, labels = synthetic.generate(50, seed=0, split="train")
    cifar.write(tmp_path, (images, labels), (images[:10], labels[:10]), {})
    ds = data.load(DataConfig(source="auto", root=str(tmp_path)))
    assert ds.source == "cifar10" and ds.description.startswith("CIFAR-10 (50 train / 10 test images")


def test_auto_without_files_is_synthetic(tmp_path):
    ds = data.load(DataConfig(source="auto", root=str(tmp_path), synthetic_train_size=30, synthetic_test_size=10))
    assert ds.source == "synthetic" and "generated" in ds.description


def test_cifar10_asked_but_absent_says_how_to_get_it(tmp_path):
    with pytest.raises(DataError, match="no CIFAR-10 under .*run `lab data prepare --root"):
        data.load(DataConfig(source="cifar10", root=str(tmp_path)))


def _batch_path(root):
    return cifar.folder(root) / "data_batch_2"


def test_truncated_batch_file_is_named(synth_root):
    path = _batch_path(synth_root)
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(DataError, match="data_batch_2: truncated or not a CIFAR-10 batch file"):
        data.load(DataConfig(source="cifar10", root=str(synth_root)))


def test_missing_batch_file_is_named(synth_root):
    _batch_path(synth_root).unlink()
    with pytest.raises(DataError, match="data_batch_2: missing; run `lab data prepare"):
        data.load(DataConfig(source="cifar10", root=str(synth_root)))


@pytest.mark.parametrize(
    "content, message",
    [
        (
            {"data": np.zeros((4, 100), np.uint8), "labels": [0] * 4},
            r"data has shape \(4, 100\).*expected \(N, 3072\) uint8",
        ),
        ({"data": np.zeros((4, 3072), np.float32), "labels": [0] * 4}, "type float32; expected"),
        (
            {"data": np.zeros((4, 3072), np.uint8), "labels": [0, 1, 2, 10]},
            r"labels range over \[0, 10\]; expected 0..9",
        ),
        ({"data": np.zeros((4, 3072), np.uint8), "labels": [0, 1]}, "labels have shape"),
        ({"pixels": np.zeros((4, 3072), np.uint8)}, "keys 'data' and 'labels' expected"),
    ],
)
def test_wrong_shapes_and_labels_are_refused(synth_root, content, message):
    with open(_batch_path(synth_root), "wb") as f:
        pickle.dump(content, f)
    with pytest.raises(DataError, match=message):
        data.load(DataConfig(source="cifar10", root=str(synth_root)))


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def test_a_pickle_that_would_run_code_is_refused(synth_root):
    with open(_batch_path(synth_root), "wb") as f:
        pickle.dump({"data": _Exploit(), "labels": []}, f)
    with pytest.raises(DataError, match="refusing to load builtins.print"):
        data.load(DataConfig(source="cifar10", root=str(synth_root)))


def test_synth_refuses_to_overwrite_real_cifar(tmp_path):
    images, labels = synthetic.generate(20, seed=0, split="train")
    cifar.write(tmp_path, (images, labels), (images, labels), {})
    with pytest.raises(DataError, match="holds real CIFAR-10; refusing to overwrite"):
        data.write_synthetic(tmp_path, 20, 20, 0)
