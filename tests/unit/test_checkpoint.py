"""Checkpoints are written atomically and loaded safely."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from lab import checkpoint
from lab.errors import CheckpointError

# Runs in a child process: save A, then die by SIGKILL inside save(B) after the data is
# written and fsynced but before the rename - a crash at the worst moment.
CRASH_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from lab import checkpoint
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
    with pytest.raises(CheckpointError, match="c.pt: not a readable checkpoint"):
        checkpoint.load(path)


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def test_weights_only_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "x": _Exploit()}, path)
    with pytest.raises(CheckpointError, match="evil.pt: not a readable checkpoint"):
        checkpoint.load(path)


def test_a_file_that_is_not_a_lab_checkpoint_is_refused(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a lab checkpoint"):
        checkpoint.load(tmp_path / "other.pt")


def test_mismatch_names_every_difference():
    state = {"compat": {"width": 8, "norm": "batch", "global_batch_size": 64}}
    with pytest.raises(CheckpointError, match=r"width is 8 in the checkpoint but 16 now; norm is 'batch'"):
        checkpoint.check_matches("c.pt", state, {"width": 16, "norm": "group", "global_batch_size": 64})
