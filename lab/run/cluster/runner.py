"""The one way the lab starts a process: torchrun jobs, benchmark children, a lesson's commands.

    runner.check_processes(8, "--nproc-per-node 8")      # before anything starts: refused if memory cannot hold 8
    done = runner.run(command, env=env, processes=8, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      timeout_seconds=180)
    done.returncode, done.timed_out, done.last_error       # the exit code; the worker's line that says what failed

A child runs in a process group of its own (its own session), so that the group is one thing to signal: torchrun
and what it starts in its group. torchrun's workers are in sessions of their own, so every process of the run
also carries the run's token in its environment (lab.run.cluster.process_tree), which finds them wherever they
went. SIGINT and SIGTERM that reach the lab process are passed on to the group and then end the lab's command too
(the previous handler runs: KeyboardInterrupt for Ctrl-C; a SIGTERM the lab did not handle before raises
Stopped, a KeyboardInterrupt). Whichever way run() ends (the child exited, its time limit, a signal, an
exception), what is left of the run gets SIGTERM (the group at once, a process outside it once the group is
gone: torchrun's orphaned workers), then SIGKILL after a grace period, whatever torchrun did; the signal handlers
that were there before are back.

A process count the machine cannot hold is refused before anything starts (LAB_ALLOW_PROCESSES overrides).
"""

from __future__ import annotations

import atexit
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lab import broken_pipe
from lab.errors import LabError, LaunchError
from lab.run.cluster import process_tree
from lab.run.cluster.child_output import last_error_line

GIB = 2**30
# A torch worker's own memory: a gloo rank (OMP_NUM_THREADS=1, torch 2.14 CUDA build on a CPU) that imported
# torch, built the pitfalls' toy MLP under DDP, then ResNet-18 (`smoke`, width 8) under DDP and ran a backward:
# Private_Clean + Private_Dirty of /proc/self/smaps_rollup 360 MiB after the toy, 390 MiB after the ResNet
# (VmRSS 740 MiB, of which ~330 MiB are torch's shared libraries, held once by every process of the machine).
# 512 MiB leaves room for a share of those libraries and of torchrun's own agent process.
WORKER_BYTES = 512 * 2**20
ALLOW_ENV = "LAB_ALLOW_PROCESSES"  # this many processes start whatever memory the machine has available
TOKENS: dict[int, str] = {}  # a background child's (start()) run token, by its pid, for stop_group
STOP_GRACE_SECONDS = 5  # after SIGTERM: torchrun passes it to its workers at once; a worker still there is stuck
KILL_GRACE_SECONDS = 2  # after SIGKILL, for the kernel to take the processes away


class TooManyProcesses(LaunchError):
    """More processes than this machine's memory holds: refused before any starts (exit 2)."""


class Stopped(KeyboardInterrupt):
    """A signal stopped the lab's command after its child's process group was stopped. A KeyboardInterrupt, so
    that whatever stops on Ctrl-C (the CLI, a notebook cell) stops on SIGTERM too."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# ----------------------------------------------------------------------------- how many processes fit


def memory_available_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """MemAvailable: what the kernel can give new processes without swapping; None where there is no such file."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def refusal(
    count: int,
    available_bytes: int | None,
    allowed: int | None = None,
    asked_by: str | None = None,
    per_process_bytes: int = WORKER_BYTES,
) -> str | None:
    """Why `count` processes must not start on a machine with `available_bytes`, or None when they may. One
    process always may (the bound is on counts); `allowed` (LAB_ALLOW_PROCESSES) lets up to that many through.

    >>> print(refusal(99, 24 * GIB, asked_by="--nproc-per-node 99"))
    --nproc-per-node 99: 99 processes need about 49.5 GiB (0.5 GiB each, a torch worker), and this machine has 24.0
    GiB available (MemAvailable): room for 48; use at most 48, or set LAB_ALLOW_PROCESSES=99 to start them anyway
    >>> refusal(99, 24 * GIB, allowed=99), refusal(48, 24 * GIB), refusal(1, 0), refusal(99, None)
    (None, None, None, None)
    """
    if available_bytes is None or (allowed is not None and count <= allowed):
        return None
    room = max(1, available_bytes // per_process_bytes)
    if count <= room:
        return None
    return (
        f"{asked_by or f'{count} processes'}: {count} processes need about {count * per_process_bytes / GIB:.1f} "
        f"GiB ({per_process_bytes / GIB:.1f} GiB each, a torch worker), and this machine has "
        f"{available_bytes / GIB:.1f} GiB available (MemAvailable): room for {room}; use at most {room}, or set "
        f"{ALLOW_ENV}={count} to start them anyway"
    )


def allowed_processes() -> int | None:
    """LAB_ALLOW_PROCESSES as a count, None when unset."""
    value = os.environ.get(ALLOW_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise LabError(f"{ALLOW_ENV}={value!r}: not a process count; use a whole number, e.g. {ALLOW_ENV}=8")
    return int(value)


def check_processes(count: int, asked_by: str | None = None) -> None:
    """Refuse (TooManyProcesses, exit 2) `count` processes this machine's memory cannot hold. Workers on GPUs are
    bounded by the GPU count where they pick their device (lab.run.cluster.dist.choose_device); their host memory is
    at least a CPU worker's, so this bound holds for them too, and a GPU server's memory passes it."""
    why = refusal(count, memory_available_bytes(), allowed_processes(), asked_by)
    if why:
        raise TooManyProcesses(why)


# ----------------------------------------------------------------------------- running


@dataclass(frozen=True)
class Finished:
    """A child's outcome: its exit code (negative: the signal that ended it) and what it printed on the pipes."""

    command: list[str]
    returncode: int
    stdout: str = ""  # captured when stdout was PIPE (with stderr folded in where stderr was STDOUT)
    stderr: str = ""  # captured when stderr was PIPE
    timed_out: bool = False  # it outlived its time limit and was stopped

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def last_error(self) -> str:
        return last_error_line(f"{self.stdout}\n{self.stderr}")


def run(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    processes: int = 1,
    stdout: Any = None,
    stderr: Any = None,
    timeout_seconds: float | None = None,
    each_line: Callable[[str], None] | None = None,
    echo: bool = True,
    stop_grace_seconds: float = STOP_GRACE_SECONDS,
    user: int | None = None,
    group: int | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> Finished:
    """Run `command` to its end in a process group of its own; return its Finished.

    `processes`: how many processes it starts (a torchrun job: its workers), refused first if memory cannot
    hold them. stdout/stderr as subprocess takes them (None: the lab's own, DEVNULL, PIPE, STDOUT, a file); a
    PIPE is read line by line as it comes, each line given to `each_line` where there is one, else kept in
    Finished. `timeout_seconds`: stopped after that long (Finished.timed_out). `echo`: print `$ command` first.
    `user`, `group`: run as that uid and gid, without root's supplementary groups (a workshop seat's check).
    `stop_when`: asked every STOP_POLL_SECONDS while it runs; True stops it as the timeout would (timed_out).
    """
    check_processes(processes)
    if echo:
        print(f"$ {shlex.join(command)}", flush=True)
    as_user: dict[str, Any] = {} if user is None else {"user": user, "group": group, "extra_groups": []}
    token = process_tree.new_token()
    proc = subprocess.Popen(
        command,
        env=process_tree.with_token(token, env),
        stdout=stdout,
        stderr=stderr,
        text=True,
        bufsize=1,
        start_new_session=True,
        **as_user,
    )
    kept: dict[str, list[str]] = {"stdout": [], "stderr": []}
    readers = [
        _reader(stream, each_line or kept[name].append)
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))
        if stream is not None
    ]
    timed_out = False
    try:
        with _signals_to_group(proc) as forwarded:
            try:
                _wait(proc, timeout_seconds, stop_when)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # whichever way the wait ended: nothing of the run outlives it
                stop_group(proc, stop_grace_seconds, terminated=bool(forwarded), token=token)
    finally:
        for reader in readers:
            reader.join(timeout=KILL_GRACE_SECONDS)
    return Finished(command, proc.returncode, "".join(kept["stdout"]), "".join(kept["stderr"]), timed_out)


STOP_POLL_SECONDS = 1.0


def _wait(proc: subprocess.Popen, timeout_seconds: float | None, stop_when: Callable[[], bool] | None) -> None:
    """proc.wait(timeout), also ended (TimeoutExpired) once `stop_when` says so."""
    if stop_when is None:
        proc.wait(timeout=timeout_seconds)
        return
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    while True:
        left = STOP_POLL_SECONDS if deadline is None else min(STOP_POLL_SECONDS, deadline - time.monotonic())
        try:
            proc.wait(timeout=max(left, 0.0))
            return
        except subprocess.TimeoutExpired:
            if stop_when() or (deadline is not None and time.monotonic() >= deadline):
                raise


def start(command: list[str], *, env: dict[str, str] | None = None, processes: int = 1) -> subprocess.Popen:
    """Start `command` in the background (its output on one pipe, stderr folded in), in a process group of its
    own that stop_group() stops; one still running when the lab's interpreter exits is stopped then."""
    check_processes(processes)
    token = process_tree.new_token()
    proc = subprocess.Popen(
        command,
        env=process_tree.with_token(token, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    TOKENS[proc.pid] = token
    atexit.register(stop_group, proc)
    return proc


def stop_group(
    proc: subprocess.Popen,
    grace_seconds: float = STOP_GRACE_SECONDS,
    terminated: bool = False,
    token: str | None = None,
) -> None:
    """Stop every process of `proc`'s run: SIGTERM to its group, and to each process of the run outside the group
    (`token`'s, lab.run.cluster.process_tree: torchrun's workers) once the group is gone; SIGKILL to whatever is
    left after `grace_seconds`. Within grace + KILL_GRACE_SECONDS every process is gone; at once when none is left.
    `terminated`: the group has had its SIGINT or SIGTERM already (passed on from the lab's own): not a SIGTERM on
    top, which a server such as JupyterHub takes for a second shutdown racing the first (the likely cause of a
    room's hub that had Ctrl-C then SIGTERM at once and had not ended 90 s later, once, on a loaded CI machine)."""
    token = token or TOKENS.pop(proc.pid, None)
    outside = _outside_group(proc, token)
    if _group_alive(proc) or outside:  # asked first: a group that is gone may have left its number to another
        if not terminated:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        warned: set[int] = set()
        while time.monotonic() < deadline:
            group = _group_alive(proc)
            outside = _outside_group(proc, token)
            if not group and not outside:
                break
            if not group:  # torchrun is gone and left these: each gets its SIGTERM, whatever torchrun sent
                process_tree.signal_each(outside - warned, signal.SIGTERM)
                warned |= outside
            time.sleep(0.05)
        if _group_alive(proc):
            _signal_group(proc.pid, signal.SIGKILL)
        process_tree.kill_each(_outside_group(proc, token))
    try:
        proc.wait(timeout=KILL_GRACE_SECONDS)
    except subprocess.TimeoutExpired:  # unkillable (uninterruptible I/O): the kernel ends it; do not hang here
        pass


def _outside_group(proc: subprocess.Popen, token: str | None) -> set[int]:
    """The run's processes that are not in its group (torchrun's workers, in sessions of their own)."""
    if token is None:
        return set()
    return {pid for pid in process_tree.members(token) if process_tree.process_group(pid) != proc.pid}


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(proc: subprocess.Popen) -> bool:
    """Some process of the group still runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    proc.poll()  # reap the leader, or it stays in the group as a zombie
    stats = Path("/proc")
    if not stats.is_dir():  # no /proc: the kernel's answer, zombies included
        return _signal_group(proc.pid, 0)
    for stat in stats.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if int(fields[2]) == proc.pid and fields[0] != "Z":
            return True
    return False


def _reader(stream: IO[str], each_line: Callable[[str], None]) -> threading.Thread:
    def read() -> None:
        delivering = True
        for line in stream:  # read to the end whatever happens to the lines: a child on a full pipe would block
            if delivering:
                try:
                    each_line(line)
                except BrokenPipeError:  # the lab's own output was piped into `head` and it quit: drop the rest
                    broken_pipe.silence_stdout()
                    delivering = False
        stream.close()

    thread = threading.Thread(target=read, name="lab-runner-pipe", daemon=True)
    thread.start()
    return thread


@contextmanager
def _signals_to_group(proc: subprocess.Popen) -> Iterator[list[int]]:
    """While the child runs: SIGINT/SIGTERM to the lab go to the child's group, then end the lab's command the
    way the previous handler would (Stopped where there was none). A second signal while the group is being
    stopped is passed on only. Signal handlers exist in the main thread only: elsewhere the caller's own."""
    received: list[int] = []  # what was passed on, in order (yielded: stop_group need not send SIGTERM twice)
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous: dict[int, Any] = {}

    def forward(signum: int, frame: Any) -> None:
        _signal_group(proc.pid, signum)
        first = not received
        received.append(signum)
        if not first:
            return
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)  # Ctrl-C's KeyboardInterrupt, or the caller's own (gpu-check's Terminated)
        raise Stopped(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # ignored before: ignored still
            previous[sig] = signal.signal(sig, forward)
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
