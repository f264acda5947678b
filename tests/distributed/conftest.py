"""Runs that tests in several modules read: each trained once a session, and only read after (a test that needs
a run of its own writes under its own tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY, lab

# One thread per rank: no OpenMP thread spins on a busy 2-core machine, and a run trained again (a resumed half,
# a rerun) adds its sums in the same order, so its losses can be compared bit for bit.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}

# 256 images at a global batch of 64 over 2 ranks: 4 steps an epoch, 12 in 3 epochs, a loss row per step and an
# evaluation (128 images) per epoch.
DETERMINISTIC_TWO_RANKS = [
    *TINY,
    "--nproc-per-node",
    "2",
    "--set",
    "run.deterministic=true",
    "--set",
    "data.synthetic_train_size=256",
    "--set",
    "data.synthetic_test_size=128",
    "--set",
    "train.epochs=3",
    "--set",
    "train.log_every=1",
]


@pytest.fixture(scope="session")
def deterministic_two_ranks(tmp_path_factory) -> Path:
    """The run directory of a deterministic 2-rank DDP run (DETERMINISTIC_TWO_RANKS), trained once for the
    stop-and-resume test (tests/distributed/test_ddp_training.py) and the 2-rank rerun (test_rerun.py)."""
    runs_dir = tmp_path_factory.mktemp("deterministic-two-ranks")
    lab(
        "train",
        *DETERMINISTIC_TWO_RANKS,
        "--set",
        f"run.output_dir={runs_dir}",
        "--set",
        "run.id=whole",
        env=ONE_THREAD,
    )
    return runs_dir / "whole"
