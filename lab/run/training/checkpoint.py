"""Atomic save and safe load of the full training state.

Saving writes a temporary file beside the target, fsyncs it and renames it over
the target (`lab.atomic`), so a crash at any moment leaves either the previous checkpoint or the
new one, never a torn file. Loading uses `torch.load(weights_only=True)`, which
builds tensors and plain containers only and refuses to run code from the file.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import zipfile
from pathlib import Path
from typing import cast

import numpy as np
import torch

from lab import atomic
from lab.errors import CheckpointError, LabError

FORMAT = 1
LAST = "last.pt"
# In a sharded strategy's checkpoint folder: the trainer's part (progress, schedule, RNG), written by rank 0
TRAINER_PART = "trainer.pt"


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (the run fails; what was saved before is untouched)."""


def run_folder(checkpoint_dir: str, run_id: str, default: Path) -> Path:
    """Where a run keeps its checkpoints: <checkpoint.dir>/<run id>/ when checkpoint.dir is set, else `default`
    (the run directory's checkpoints/, on the node that holds global rank 0).

    >>> run_folder("", "r1", Path("runs/r1/checkpoints")).as_posix()
    'runs/r1/checkpoints'
    >>> run_folder("/shared/lab", "r1", Path("runs/r1/checkpoints")).as_posix()
    '/shared/lab/r1'
    """
    return Path(checkpoint_dir) / run_id if checkpoint_dir else default


def prepare_folder(folder: Path) -> Path:
    """A checkpoint folder outside the run directory (checkpoint.dir): created and proved writable now, not
    after an hour of training, and cleared of the temporary files a save killed midway left (lab.atomic's
    `*.tmp-*`: nothing writes them while rank 0 starts the run)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"\0" * 4096)
        probe.unlink()
    except OSError as exc:
        raise LabError(
            f"checkpoint.dir: cannot write to {folder} ({exc.strerror or exc}); choose a writable "
            f"folder (every node's, for a multi-node run) with --set checkpoint.dir=DIR"
        ) from None
    for tmp in folder.glob("*.tmp-*"):
        tmp.unlink(missing_ok=True)
    return folder


def check_space(folder: Path, need_bytes: int, what: str) -> None:
    """Refuse to start when checkpoint.dir's file system cannot hold `need_bytes` more."""
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise LabError(
            f"checkpoint.dir: {folder} has {free / 2**20:.1f} MiB free but this run needs about "
            f"{need_bytes / 2**20:.1f} MiB ({what}); free some space or choose another folder with "
            f"--set checkpoint.dir=DIR"
        )


def save(path: str | Path, state: dict) -> Path:
    path = Path(path)
    # Serialised in memory first: torch.save into a file turns a write error (a full disk) into an opaque
    # RuntimeError, a plain write keeps the OSError and its reason. ResNet-18's state is ~90 MB.
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    try:
        atomic.write_bytes(path, buffer.getbuffer(), durable=True)
    except OSError as exc:  # a full disk, a vanished mount: say so, and that nothing older was touched
        kept = "the previous checkpoint is intact" if path.exists() else "there is no earlier checkpoint"
        raise CheckpointWriteError(f"{path}: checkpoint not written ({exc.strerror or exc}); {kept}") from exc
    return path


NOT_A_CHECKPOINT = "not a checkpoint written by lab (or by torch.save)"


def check_resumable(choice: str) -> None:
    """checkpoint.resume as a path: it exists, and a file is a torch.save archive (a zip); else one line, before
    anything of the run is made. (A sharded strategy's checkpoint is a folder: its own loader reads it.)"""
    path = Path(choice)
    if not path.exists():
        raise CheckpointError(f"checkpoint.resume: {path} does not exist; give an existing file, auto or never")
    if path.is_file() and not zipfile.is_zipfile(path) and not _is_pointer(path):
        raise CheckpointError(
            f"checkpoint.resume: {path} is {NOT_A_CHECKPOINT}: torch.save writes a zip archive "
            f"and this file is not one; give a run's checkpoints/last.pt, or set "
            f"checkpoint.resume=never"
        )


def _is_pointer(path: Path) -> bool:
    """A one-line text file naming a folder beside it: DeepSpeed's `latest`, which a sharded checkpoint is resumed
    by (its strategy's loader reads the folder it names)."""
    try:
        name = path.read_text(encoding="utf-8").strip() if path.stat().st_size < 256 else ""
    except (OSError, UnicodeDecodeError):
        return False
    return bool(name) and "/" not in name and (path.parent / name).is_dir()


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: {NOT_A_CHECKPOINT}: torch.save writes a zip archive and this file is not one")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        if "Weights only load failed" in str(exc):  # torch's refusal of a pickle that would run code or make objects
            raise CheckpointError(
                f"{path}: refused: loading it would run code or build objects a lab checkpoint never "
                f"holds (torch.load with weights_only=True); it is {NOT_A_CHECKPOINT}"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: {NOT_A_CHECKPOINT}, or one cut short ({first[:120]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a lab checkpoint of format {FORMAT}")
    return state


def check_matches(path: str | Path, state: dict, expected: dict[str, object]) -> None:
    """Refuse a checkpoint whose recorded facts differ from this run's, naming each difference."""
    recorded = state.get("compat", {})
    diffs = [
        f"{key} is {recorded.get(key)!r} in the checkpoint but {value!r} now"
        for key, value in expected.items()
        if recorded.get(key) != value
    ]
    if diffs:
        raise CheckpointError(f"{path}: does not fit this run: {'; '.join(diffs)}")


# ----------------------------------------------------------------------------- random state
# Stored as tensors and plain values so weights_only loading accepts them.


def rng_state(device: torch.device | None = None) -> dict:
    """Python, NumPy and torch CPU generator states, and the CUDA generator of `device` (this rank's) only.

    Only this rank's device: a checkpoint holding every visible GPU's state could not be restored
    where fewer GPUs are visible (8 -> 2, or a 1-GPU box), and the other GPUs' generators are not
    this process's to keep."""
    version, keys, gauss = random.getstate()
    # legacy=True (the default) gives this tuple for an MT19937, the global generator's bit generator unless
    # np.random.set_bit_generator swapped it (the lab never does); the stubs allow that case's dict too
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = cast(
        "tuple[str, np.ndarray, int, int, float]", np.random.get_state(legacy=True)
    )
    state = {
        "python": {"version": version, "keys": torch.tensor(keys, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": np_pos,
            "has_gauss": np_has_gauss,
            "gauss": np_gauss,
        },
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore what `rng_state` saved; the CUDA state goes to `device`, whichever index it has now."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["keys"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["gauss"])
    )
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is None or device is None or device.type != "cuda":
        return
    if isinstance(cuda, (list, tuple)):  # format of earlier checkpoints: every visible GPU's state, by index
        if not cuda:
            return
        cuda = cuda[device.index] if device.index is not None and device.index < len(cuda) else cuda[0]
    torch.cuda.set_rng_state(cuda.cpu(), device)
