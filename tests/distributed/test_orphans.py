"""No worker left running after Ctrl-C: torchrun starts each worker in a session of its own and, on a signal, exits
without waiting for a worker that a C++ collective holds; the runner finds them by its run's token
(lab.run.cluster.process_tree) and stops them. Plain torch scripts (no lab import, no signal handling of their own),
real torchrun and gloo, real signals; what is left read from /proc, by the script's own path in each command line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lab.run.cluster import launch, runner
from tests.conftest import PYTHON, ROOT

LEFT_WITHIN = 10  # seconds after the signal: the reproduction, "no process 10 s after Ctrl-C"
READY_WITHIN = 120  # seconds for both ranks to reach their collective on a loaded 2-core machine

HEAD = """
import ctypes, os, pathlib, signal, sys, time
import torch
import torch.distributed as dist

if len(sys.argv) > 2:  # a script that ignores SIGTERM, as a worker whose framework takes it over would
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(1000)
pathlib.Path(sys.argv[1], f"ready-{rank}").write_text(str(os.getpid()))
"""
BODIES = {
    # the reproduction: rank 1 in broadcast where rank 0 is in all_reduce, same size: both wait
    "mismatch": "dist.all_reduce(x) if rank == 0 else dist.broadcast(x, src=0)",
    # rank 0 waits in a barrier that rank 1 never reaches
    "barrier": "dist.barrier() if rank == 0 else time.sleep(3600)",
    # a C-level sleep: no Python signal handler runs until it returns
    "c sleep": "ctypes.CDLL(None).sleep(3600)",
}


def _script(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"orphan_{name.replace(' ', '_')}.py"
    path.write_text(textwrap.dedent(HEAD) + BODIES[name] + "\n")
    return path


def _running(marker: str) -> list[int]:
    """Live processes (zombies are dead) whose command line names `marker` (the script's path)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def _wait_ready(tmp_path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_WITHIN
    while not all((tmp_path / f"ready-{r}").exists() for r in (0, 1)):
        assert proc.poll() is None, f"the run ended before its ranks met: {proc.stderr.read() if proc.stderr else ''}"
        assert time.monotonic() < deadline, "the ranks never reached their collective"
        time.sleep(0.2)
    time.sleep(1)  # into the collective


def _kill_left(marker: str) -> None:
    for pid in _running(marker):  # only when the test failed: never leave them running
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize(
    ("name", "sig"),
    [
        ("mismatch", signal.SIGINT),
        ("barrier", signal.SIGINT),
        ("c sleep", signal.SIGINT),
        ("mismatch", signal.SIGTERM),  # its workers ignore SIGTERM: torchrun would wait 30 s, the lab does not
    ],
)
def test_a_signal_to_lab_launch_leaves_no_worker_of_a_plain_script_running(tmp_path, name, sig):
    script = _script(tmp_path, name)
    ignore = ["ignore-sigterm"] if sig == signal.SIGTERM else []
    lab = subprocess.Popen(
        [PYTHON, "-m", "lab", "launch", "--nproc-per-node", "2", "--", str(script), str(tmp_path), *ignore],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as a terminal's job: the signal reaches the lab process alone
        # and with SIGINT as a terminal gives it: a suite run as a background job (`cmd &` in a script, as CI's)
        # passes SIGINT on ignored, and Ctrl-C would then be a no-op for the lab and its children
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_ready(tmp_path, lab)
        workers = [int((tmp_path / f"ready-{r}").read_text()) for r in (0, 1)]
        assert all(os.getsid(w) != os.getsid(lab.pid) for w in workers)  # torchrun's: sessions of their own
        lab.send_signal(sig)  # Ctrl-C (SIGINT) or SIGTERM to the lab process only
        deadline = time.monotonic() + LEFT_WITHIN
        while _running(str(script)) and time.monotonic() < deadline:
            lab.poll()
            time.sleep(0.2)
        assert _running(str(script)) == [], f"processes of {script.name} left {LEFT_WITHIN} s after {sig.name}"
        assert lab.wait(timeout=5) != 0
    finally:
        _kill_left(str(script))
        lab.kill()
        lab.wait()


def test_a_time_limit_leaves_no_worker_of_a_c_level_sleep_running(tmp_path):
    script = _script(tmp_path, "c sleep")
    command = launch.torchrun_command(2, [str(script), str(tmp_path), "ignore-sigterm"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    try:
        done = runner.run(command, env=env, processes=2, timeout_seconds=20, stdout=subprocess.DEVNULL, echo=False)
        assert done.timed_out and all((tmp_path / f"ready-{r}").exists() for r in (0, 1))
        assert _running(str(script)) == []  # run() returns once every process of the run is gone
        assert time.monotonic() - started < 20 + runner.STOP_GRACE_SECONDS + runner.KILL_GRACE_SECONDS + 10
    finally:
        _kill_left(str(script))


def test_the_runs_token_reaches_torchruns_workers_in_their_own_sessions(tmp_path):
    """How the runner finds them: every process of the run holds its token, whatever its session."""
    from lab.run.cluster import process_tree

    script = tmp_path / "token.py"
    script.write_text("import os, sys, time; print(os.environ['LAB_PROCESS_TREES'], flush=True); time.sleep(600)\n")
    proc = subprocess.Popen(
        launch.torchrun_command(2, [str(script)]),
        env=process_tree.with_token("lab-test-token"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and "lab-test-token" in proc.stdout.readline()
        deadline = time.monotonic() + READY_WITHIN
        while len(set(_running(str(script))) - {proc.pid}) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        members = process_tree.members("lab-test-token")
        workers = set(_running(str(script))) - {proc.pid}  # torchrun's command line names the script too
        assert workers and workers <= members and proc.pid in members
        assert all(process_tree.process_group(w) != proc.pid for w in workers)  # outside torchrun's group
    finally:
        runner.stop_group(proc, token="lab-test-token")
    assert _running(str(script)) == [] and not process_tree.members("lab-test-token")


if sys.platform != "linux":  # /proc and sessions as Linux has them
    pytestmark = pytest.mark.skip(reason="Linux only")
