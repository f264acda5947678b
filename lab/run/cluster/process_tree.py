"""Every process of a run, wherever it went: a token in the environment that each of its processes inherits.

The runner starts a child in a process group of its own, but that group does not hold torchrun's workers: torchrun
starts each in a session of its own (torch/distributed/elastic/multiprocessing/subprocess_handler: Popen(...,
start_new_session=True)). When torchrun exits without waiting for them (after passing on a Ctrl-C that a worker
blocked in a C++ collective never acts on), they are orphans of PID 1 in no group of the lab's. So each child
the runner starts carries a token in LAB_PROCESS_TREES, which every process under it inherits through its
environment whatever its session or parent; a lab command started by a lab command keeps its parent's token
beside its own, so the outer run still finds the inner one's workers. /proc/PID/environ is what the process was
started with: a process cannot leave its run by changing its environment later.

>>> env = with_token("run-a", {"PATH": "/bin"})
>>> env[TREES_ENV], with_token("run-b", env)[TREES_ENV]
('run-a', 'run-a run-b')
>>> holds(b"PATH=/bin\\x00LAB_PROCESS_TREES=run-a run-b\\x00", "run-b"), holds(b"PATH=/bin\\x00", "run-b")
(True, False)
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

TREES_ENV = "LAB_PROCESS_TREES"
PROC = Path("/proc")


def new_token() -> str:
    return f"lab-{uuid.uuid4().hex[:12]}"


def with_token(token: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's environment when None) with `token` added to LAB_PROCESS_TREES."""
    base = dict(os.environ if env is None else env)
    return {**base, TREES_ENV: " ".join([*base.get(TREES_ENV, "").split(), token])}


def holds(environ: bytes, token: str) -> bool:
    """Whether a /proc/PID/environ's contents name `token` in LAB_PROCESS_TREES."""
    prefix = TREES_ENV.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return token in entry[len(prefix) :].decode(errors="replace").split()
    return False


def members(token: str) -> set[int]:
    """The running processes (zombies left out) whose environment holds `token`; this one never."""
    found: set[int] = set()
    if not PROC.is_dir():
        return found
    for folder in PROC.glob("[0-9]*"):
        pid = int(folder.name)
        if pid == os.getpid() or not running(pid):
            continue
        try:
            environ = (folder / "environ").read_bytes()
        except OSError:  # gone, or another user's (a seat's process under a non-root lab: not the lab's to stop)
            continue
        if holds(environ, token):
            found.add(pid)
    return found


def running(pid: int) -> bool:
    """The process exists and is not a zombie (dead, waiting for its parent to reap it)."""
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def signal_each(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_each(pids: Iterable[int]) -> None:
    signal_each(pids, signal.SIGKILL)
