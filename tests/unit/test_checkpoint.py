"""Checkpoints are written atomically and loaded safely."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from lab.errors import CheckpointError
from lab.run.training import checkpoint

# Runs in a child process: save A, then die by SIGKILL inside save(B) after the data is
# written and fsynced but before the rename - a crash at the worst moment.
CRASH_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from lab.run.training import checkpoint
    path = sys.argv[1]
    checkpoint.save(path, {"value": torch.tensor([1.0])})
    os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.save(path, {"value": torch.tensor([2.0])})
""")


def test_crash_between_write_and_rename_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    proc = subprocess.run([sys.executable, "-c", CRASH_DURING_SAVE, str(path)], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr  # really killed mid-save
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last.pt"]
    assert leftovers and all(".tmp-" in name for name in leftovers)  # the torn new file, never under the real name
    assert checkpoint.load(path)["value"].item() == 1.0


def test_round_trip_and_rng_state(tmp_path):
    state = {"model": {"w": torch.randn(3)}, "rng": checkpoint.rng_state(), "progress": {"step": 4}}
    expected = torch.rand(5)  # drawn right after the state was taken
    checkpoint.set_rng_state(checkpoint.load(checkpoint.save(tmp_path / "c.pt", state))["rng"])
    assert torch.equal(torch.rand(5), expected)


def test_truncated_checkpoint_is_refused_with_its_path(tmp_path):
    path = checkpoint.save(tmp_path / "c.pt", {"w": torch.randn(1000)})
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match=r"c.pt: not a checkpoint written by lab \(or by torch.save\)"):
        checkpoint.load(path)


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def test_weights_only_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "x": _Exploit()}, path)
    with pytest.raises(CheckpointError, match="evil.pt: refused: loading it would run code"):
        checkpoint.load(path)


def test_a_file_that_is_not_a_lab_checkpoint_is_refused(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a lab checkpoint"):
        checkpoint.load(tmp_path / "other.pt")


def test_mismatch_names_every_difference():
    state = {"compat": {"width": 8, "norm": "batch", "global_batch_size": 64}}
    with pytest.raises(CheckpointError, match=r"width is 8 in the checkpoint but 16 now; norm is 'batch'"):
        checkpoint.check_matches("c.pt", state, {"width": 16, "norm": "group", "global_batch_size": 64})


class FakeCudaGenerators:
    """Stands in for torch.cuda's RNG functions: no GPU here. `visible` GPUs, each with a state laid out like
    the CPU generator's (a ByteTensor); an index past the visible ones raises IndexError, as torch.cuda does."""

    def __init__(self, visible: int) -> None:
        self.states = {i: torch.get_rng_state() + i for i in range(visible)}

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.get(i) for i in range(len(self.states))])

    def _index(self, device) -> int:
        index = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
        if index >= len(self.states):
            raise IndexError(f"cuda:{index}: only {len(self.states)} visible")
        return index

    def get(self, device="cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set(self, state: torch.Tensor, device="cuda") -> None:
        self.states[self._index(device)] = state.clone()


def test_cuda_rng_of_rank_5_of_8_restores_on_a_two_gpu_host(tmp_path, monkeypatch):
    saving = FakeCudaGenerators(visible=8)
    saving.install(monkeypatch)
    state = checkpoint.rng_state(torch.device("cuda", 5))
    assert torch.equal(state["cuda"], saving.states[5])  # this rank's device only, not all eight
    saved = checkpoint.load(checkpoint.save(tmp_path / "c.pt", {"rng": state}))["rng"]

    restoring = FakeCudaGenerators(visible=2)
    restoring.install(monkeypatch)
    checkpoint.set_rng_state(saved, torch.device("cuda", 1))
    assert torch.equal(restoring.states[1], saving.states[5])
    assert not torch.equal(restoring.states[0], saving.states[5])  # the other GPU is not this rank's to touch


def test_an_earlier_checkpoint_with_every_gpus_state_restores_with_fewer_gpus(monkeypatch):
    saving = FakeCudaGenerators(visible=8)
    saving.install(monkeypatch)
    old = {**checkpoint.rng_state(), "cuda": torch.cuda.get_rng_state_all()}  # the earlier format: a list
    restoring = FakeCudaGenerators(visible=2)
    restoring.install(monkeypatch)
    checkpoint.set_rng_state(old, torch.device("cuda", 1))
    assert torch.equal(restoring.states[1], saving.states[1])


def test_a_resume_path_is_a_torch_archive_or_deepspeeds_pointer_to_a_folder_beside_it(tmp_path):
    """checkpoint.resume is checked before anything starts: a text file is refused in one line, but DeepSpeed's
    `latest` (one line naming the tag folder beside it) is how a ZeRO run resumes, and must pass to its loader."""
    folder = tmp_path / "deepspeed"
    (folder / "step5").mkdir(parents=True)
    (folder / "latest").write_text("step5\n")
    checkpoint.check_resumable(str(folder / "latest"))
    checkpoint.check_resumable(str(folder))  # the folder itself: the strategy's loader reads it
    checkpoint.check_resumable(str(checkpoint.save(tmp_path / "last.pt", {"w": torch.zeros(1)})))
    (tmp_path / "notes.pt").write_text("step5\n")  # a pointer to nothing beside it is just text
    with pytest.raises(CheckpointError, match=r"notes.pt is not a checkpoint written by lab \(or by torch.save\)"):
        checkpoint.check_resumable(str(tmp_path / "notes.pt"))
