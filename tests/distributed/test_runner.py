"""The one runner: every command that starts torchrun leaves nothing behind when it is stopped, and a process
count the machine cannot hold is refused before anything starts. Real processes throughout: the real CLI, real
torchrun, real signals; the process table read from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.errors import LabError
from lab.run.cluster import runner
from tests.conftest import PYTHON, ROOT, TINY

LEFT_WITHIN = 10  # seconds after SIGTERM by which no process of the command may be left
WORKERS_WITHIN = 120  # seconds for the command to get its workers going on a loaded 2-core machine


def _stat(pid: str) -> tuple[int, str, int, int] | None:
    """(pid, state, parent, session) of one process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(pid), fields[0], int(fields[1]), int(fields[3])


def _processes() -> list[tuple[int, str, int, int]]:
    return [s for s in map(_stat, (p.name for p in Path("/proc").iterdir() if p.name.isdigit())) if s]


def _descendants(root: int) -> set[int]:
    table = _processes()
    found, grew = {root}, True
    while grew:
        more = {pid for pid, _, parent, _ in table if parent in found} - found
        found |= more
        grew = bool(more)
    return found - {root}


def _left(sessions: set[int]) -> list[int]:
    """Live processes (zombies are dead) of any of these sessions."""
    return [pid for pid, state, _, session in _processes() if session in sessions and state != "Z"]


# Each command as small as it goes, and how many processes below the lab process mean its workers are there.
COMMANDS = {
    "train": (
        [
            "train",
            *TINY,
            "--nproc-per-node",
            "2",
            "--set",
            "data.source=synthetic",
            "--set",
            "train.max_steps=100000",
            "--set",
            "checkpoint.save=false",
        ],
        3,
    ),
    "bench scaling": (["bench", "scaling", *TINY, "--max-world-size", "2", "--steps", "1000", "--warmup", "1"], 2),
    "pitfall": (["pitfall", "set-epoch", "--nproc-per-node", "2"], 3),
    "memory --measure": (["memory", "--measure", "--measure-width", "8"], 1),
    "workshop": (["workshop", *TINY, "--only", "allreduce"], 3),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigterm_to_the_lab_process_leaves_no_process_behind(name, tmp_path):
    argv, below = COMMANDS[name]
    argv = [
        *argv,
        *{"train": ["--set", f"run.output_dir={tmp_path}"], "workshop": ["--output-dir", str(tmp_path)]}.get(name, []),
    ]
    env = {k: v for k, v in os.environ.items() if k != runner.ALLOW_ENV}
    lab = subprocess.Popen(
        [PYTHON, "-m", "lab", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    sessions = {lab.pid}  # the lab's own session, then the one each child of the runner gets
    try:
        deadline = time.monotonic() + WORKERS_WITHIN
        while len(_descendants(lab.pid)) < below and lab.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        tree = _descendants(lab.pid)
        assert len(tree) >= below, f"{name}: its workers never appeared; exit {lab.poll()}: {lab.stderr.read()[-2000:]}"
        sessions |= {s[3] for s in map(_stat, map(str, tree)) if s}
        lab.send_signal(signal.SIGTERM)  # to the lab process only: the runner passes it on
        deadline = time.monotonic() + LEFT_WITHIN
        while _left(sessions) and time.monotonic() < deadline:
            lab.poll()  # reap the lab process itself
            time.sleep(0.2)
        assert _left(sessions) == [], f"{name}: processes left {LEFT_WITHIN} s after SIGTERM"
        assert lab.wait(timeout=1) != 0
    finally:
        for session in sessions:
            try:
                os.killpg(session, signal.SIGKILL)  # only if the test failed: never leave them running
            except (ProcessLookupError, PermissionError):
                pass
        lab.wait()


def test_more_ranks_than_memory_holds_are_refused_before_any_starts(tmp_path):
    room = runner.memory_available_bytes() // runner.WORKER_BYTES
    count = max(99, room + 1)
    env = {k: v for k, v in os.environ.items() if k != runner.ALLOW_ENV}
    done = subprocess.run(
        [PYTHON, "-m", "lab", "pitfall", "set-epoch", "--nproc-per-node", str(count)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"--nproc-per-node {count}" in done.stderr and f"{runner.ALLOW_ENV}={count}" in done.stderr
    assert "$ " not in done.stdout  # the runner echoes a command as it starts it: none started


def test_the_memory_bound_is_processes_times_a_workers_memory_against_what_is_available():
    gib = 2**30
    each = runner.WORKER_BYTES
    assert runner.refusal(8, 8 * each) is None  # exactly full: allowed
    refused = runner.refusal(9, 8 * each, asked_by="--nproc-per-node 9")
    assert refused.startswith("--nproc-per-node 9: 9 processes need about 4.5 GiB") and "room for 8" in refused
    assert runner.refusal(9, 8 * each, allowed=9) is None and runner.refusal(10, 8 * each, allowed=9)
    assert runner.refusal(1, 0) is None  # one process is never refused: the bound is on counts
    assert runner.refusal(10**6, None) is None  # no MemAvailable (not Linux): no bound
    assert runner.refusal(100, 48 * gib) is not None and runner.refusal(96, 48 * gib) is None


def test_the_override_lets_a_refused_count_through(monkeypatch):
    monkeypatch.delenv(runner.ALLOW_ENV, raising=False)
    count = runner.memory_available_bytes() // runner.WORKER_BYTES + 1
    with pytest.raises(runner.TooManyProcesses, match=runner.ALLOW_ENV):
        runner.check_processes(count)
    monkeypatch.setenv(runner.ALLOW_ENV, str(count))
    runner.check_processes(count)
    monkeypatch.setenv(runner.ALLOW_ENV, "lots")
    with pytest.raises(LabError, match="not a process count"):
        runner.check_processes(count)


def test_a_grandchild_left_by_a_finished_child_is_stopped_with_its_group():
    # The child starts a sleeper in the background and exits 0 at once, as a torchrun whose worker outlived it.
    spawn = "import subprocess, sys; print(subprocess.Popen(['sleep', '300']).pid, flush=True)"
    done = runner.run([sys.executable, "-c", spawn], stdout=subprocess.PIPE, echo=False)
    assert done.returncode == 0
    assert _stat(done.stdout.strip()) is None or _stat(done.stdout.strip())[1] == "Z"


def test_a_child_past_its_time_limit_is_stopped_with_its_group():
    done = runner.run(
        ["sh", "-c", "sleep 300 & echo $!; sleep 300"], stdout=subprocess.PIPE, timeout_seconds=2, echo=False
    )
    assert done.timed_out and not done.ok and done.returncode < 0
    assert _stat(done.stdout.strip()) is None or _stat(done.stdout.strip())[1] == "Z"
