"""The infrastructure tests' shared fixtures."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.slurm_cluster import SlurmCluster, missing_tools


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    """A real Slurm cluster on this host (tests/infra/slurm_cluster.py), one per xdist worker that asks for it."""
    missing = missing_tools()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(
                f"{', '.join(missing)} not installed; `make test` installs them (scripts/install-test-tools.sh)"
            )
        pytest.skip(f"{', '.join(missing)} not installed (scripts/install-test-tools.sh installs them as root)")
    root = Path(tempfile.mkdtemp(prefix="lab-slurm-"))
    root.chmod(0o755)  # munge's socket folder, and each folder above it, must be world-executable
    started = time.monotonic()
    slurm = SlurmCluster(root / "cluster").start()
    print(f"two-node Slurm cluster up in {time.monotonic() - started:.1f} s")
    try:
        yield slurm
    finally:
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)
