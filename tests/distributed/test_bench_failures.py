"""A failed strategy of `lab bench strategies` is a row with the worker's exception, not torchrun's banner."""

from __future__ import annotations

import subprocess

from lab.measure.bench.train.strategies import failed_row
from lab.run.cluster import launch


def test_a_failed_strategy_row_names_the_workers_exception_not_torchruns_banner(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("raise RuntimeError('FSDP: this rank ran out of memory')\n")
    command = launch.torchrun_command(1, [str(script)])
    done = subprocess.run(command, env=launch.worker_env(1), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and done.stderr.strip().splitlines()[-1].startswith("=====")  # the banner's end
    row = failed_row("FSDP", done.stderr)
    assert row["label"] == "FSDP"
    assert row["error"].startswith("failed: ") and "RuntimeError: FSDP: this rank ran out of memory" in row["error"]
