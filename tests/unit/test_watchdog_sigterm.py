"""A rank that torchrun stops with SIGTERM leaves its record, whichever thread hears the signal first. The case
that lost it (a clean clone, 2026-12-06): the rank's collective had raised (a dead peer's closed connection), so
the main thread was free, in the failure path, when SIGTERM came; the handler ended the process and the failure
path stopped the watchdog before its thread read the signal's byte. The rank was named dead (exit code 143)
among the ranks that waited. A real process and a real signal; one rank, no process group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.run.cluster import hang, watchdog

# As dist.initialized's failure path: a collective raised, SIGTERM arrives before the rank's record is written,
# and the way out stops the watchdog (teardown).
FAILING_RANK = """
import os, signal, sys
from pathlib import Path
from lab.run.cluster.watchdog import Watchdog

w = Watchdog(rank=0, world_size=2, stall_seconds=60, folder=Path(sys.argv[1])).start()
try:
    try:
        raise RuntimeError("Connection closed by peer")  # a dead peer's, in the collective
    except RuntimeError:
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, after the peer's death
        w.dump("raised RuntimeError", overwrite=False, failed=True)
        raise
finally:
    w.stop()
"""


def test_a_rank_stopped_by_sigterm_in_its_failure_path_leaves_its_record(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FAILING_RANK, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 128 + 15, done.stderr[-2000:]  # the end SIGTERM's default would have been
    record = hang.read_snapshots(tmp_path).get(0)
    assert record is not None, f"no record left; {done.stderr[-2000:]}"
    assert record["reason"] == watchdog.STOPPED_BY_SIGTERM
