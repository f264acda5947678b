"""A class at once: processes that each say they are ready, then start when told, so what a test measures (a
queue's waits) is the queue's, not the interpreters' start-up.

A process started here gets the gate folder as its last argument and runs GATE first: it says it is ready (a file
named for its pid) and waits for the folder's `go`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

GATE = """
import os, sys, time
from pathlib import Path
Path(sys.argv[-1], str(os.getpid())).touch()
while not Path(sys.argv[-1], "go").exists():
    time.sleep(0.01)
"""


def run_together(script: str, argvs: list[list[str]], gate: Path, env: dict[str, str] | None = None) -> list[dict]:
    """`script` (GATE first) once per argv, all started at one moment; each one's printed JSON line, in order. An
    assertion names the stderr of any that failed."""
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GATE + script, *argv, str(gate)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for argv in argvs
    ]
    deadline = time.monotonic() + 120
    while len(list(gate.iterdir())) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    (gate / "go").touch()
    out = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-800:] for _, err in out]
    return [json.loads(stdout) for stdout, _ in out]
