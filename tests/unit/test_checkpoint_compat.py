"""Checkpoints stay loadable across versions of the lab: a checkpoint written before a module moved (issue 24 moved
every one) must still resume. lab/run/training/checkpoint.py loads with torch.load(weights_only=True), which builds
tensors and plain containers only, so a checkpoint can hold no class of the lab: its pickle names no `lab.` module.

Asserted on the files a real one-step run writes (the baseline's last.pt; FSDP's trainer.pt, .metadata and every
item of its shards), opcode by opcode, and by loading them as the lab does. Not run here: DeepSpeed (seconds of
import and global state in a test process). Its own files name its classes (a loss scaler, the ZeRO stage enum)
and DeepSpeed loads them; its trainer.pt is the Trainer.state() checked here plus a dict of plain values."""

from __future__ import annotations

import io
import pickle
import pickletools
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from lab import compat
from lab.errors import CheckpointError, LabError
from lab.run import config
from lab.run.training import checkpoint, lifecycle

# The opcodes that push a string; GLOBAL names "module qualname" itself, STACK_GLOBAL takes the last two strings
# pushed (protocol 4 and later, where the pickler memoizes them: a repeat is a GET of the memo).
STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
GETS = {"BINGET", "LONG_BINGET", "GET"}
PUTS = {"BINPUT", "LONG_BINPUT", "PUT"}


def globals_named(data: bytes) -> set[str]:
    """Every `module.qualname` a pickle names: what unpickling it would import."""
    named: set[str] = set()
    memo: dict[Any, Any] = {}
    pushed: list[Any] = []
    last = None  # the string the previous opcode pushed, if it pushed one
    for opcode, arg, _ in pickletools.genops(data):
        value = None
        if opcode.name in STRINGS:
            value = arg
        elif opcode.name in GETS:
            value = memo.get(arg)
        elif opcode.name == "MEMOIZE":
            memo[len(memo)] = last
        elif opcode.name in PUTS:
            memo[arg] = last
        elif opcode.name == "GLOBAL":
            named.add(".".join(str(arg).split(" ", 1)))
        elif opcode.name == "STACK_GLOBAL":
            named.add(f"{pushed[-2]}.{pushed[-1]}")
        if opcode.name in STRINGS or opcode.name in GETS:
            pushed.append(value)
        if opcode.name not in {"MEMOIZE", *PUTS}:  # a memo opcode leaves the stack as it was
            last = value
    return named


def pickled(data: bytes) -> bytes:
    """The pickle of a torch.save file (a zip holding <name>/data.pkl), or `data` itself when it is a plain one."""
    if not data.startswith(b"PK"):
        return data
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        [name] = [name for name in archive.namelist() if name.endswith("data.pkl")]
        return archive.read(name)


def lab_globals(data: bytes) -> set[str]:
    """The lab's classes and functions a checkpoint file's pickle names."""
    return {name for name in globals_named(pickled(data)) if name == "lab" or name.startswith("lab.")}


def dcp_items(folder: Path) -> list[bytes]:
    """Every item of a torch.distributed.checkpoint folder: its .metadata, and each slice of its .distcp files
    the metadata points at (tensors, and the torch.save'd objects a state dict holds besides them)."""
    from torch.distributed.checkpoint import FileSystemReader

    storage = FileSystemReader(str(folder)).read_metadata().storage_data
    items = [
        (folder / info.relative_path).read_bytes()[info.offset : info.offset + info.length] for info in storage.values()
    ]
    return [(folder / ".metadata").read_bytes(), *items]


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """One intra-op thread (lab.run.cluster.dist reads OMP_NUM_THREADS), restored after: a width-8 step is faster
    alone."""
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(before)


def _one_step(tmp_path: Path, *overrides: str) -> Path:
    """A one-step run of the smoke config in this process, as `lab train` runs it alone; its checkpoints folder."""
    cfg = config.load(
        "smoke",
        [
            "model.width=8",
            "run.id=compat",
            f"run.output_dir={tmp_path}",
            "train.max_steps=1",
            "train.global_batch_size=16",
            "data.synthetic_train_size=32",
            "data.synthetic_test_size=16",
            *overrides,
        ],
    )
    assert lifecycle.run(cfg)["status"] == "completed"
    return tmp_path / "compat" / "checkpoints"


def test_the_baselines_checkpoint_names_no_lab_module_and_loads_weights_only(tmp_path):
    path = _one_step(tmp_path) / checkpoint.LAST  # the baseline: DDP's writer at world size 1
    assert globals_named(pickled(path.read_bytes()))  # torch's rebuild functions: the scan does see its globals
    assert lab_globals(path.read_bytes()) == set()
    state = torch.load(path, weights_only=True)  # what checkpoint.load does, nothing of the lab's allowed
    assert {"model", "optimizer", "scheduler", "rng", "progress", "config"} <= set(state)
    assert checkpoint.load(path)["progress"]["step"] == 1


@pytest.mark.skipif(
    not compat.fsdp_runs_on_cpu(), reason="FSDP2 on CPU tensors needs torch.cpu.Stream.record_event (torch > 2.6)"
)
def test_fsdps_sharded_checkpoint_names_no_lab_module(tmp_path):
    # One rank in a group of one (`lab train --set dist.strategy=fsdp` alone): the files of 8 GPUs, in one shard.
    folder = _one_step(tmp_path, "dist.strategy=fsdp") / "fsdp"
    items = dcp_items(folder)
    assert len(items) > 2 and all(lab_globals(item) == set() for item in items)
    assert lab_globals((folder / checkpoint.TRAINER_PART).read_bytes()) == set()
    assert checkpoint.load(folder / checkpoint.TRAINER_PART)["progress"]["step"] == 1  # weights_only, as it resumes


@pytest.mark.parametrize(
    "write",
    [
        lambda path, state: torch.save(state, path),  # torch's zip, protocol 2: GLOBAL
        lambda path, state: path.write_bytes(pickle.dumps(state, protocol=5)),  # DCP's .metadata style: STACK_GLOBAL
    ],
    ids=["torch.save", "pickle-5"],
)
def test_a_lab_object_in_a_checkpoint_is_caught(tmp_path, write):
    # The mistake this guards against: a lab object (here an error, as a config object would be) in the state.
    path = tmp_path / "planted.pt"
    write(
        path,
        {"model": {"w": torch.zeros(2)}, "why": LabError("x"), "again": LabError("y"), "also": CheckpointError("z")},
    )  # a second class of the same module: its name comes from the memo
    assert lab_globals(path.read_bytes()) == {"lab.errors.LabError", "lab.errors.CheckpointError"}
    if zipfile.is_zipfile(path):
        with pytest.raises(pickle.UnpicklingError, match="weights_only"):
            torch.load(path, weights_only=True)
