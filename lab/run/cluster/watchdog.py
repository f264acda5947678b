"""Each rank's watchdog: a thread that sees the main thread stop moving and, after dist.hang_seconds, writes this
rank's snapshot (lab.run.cluster.flight) and asks the other ranks for theirs; the first rank to ask gathers them and
prints the diagnosis (lab.run.cluster.hang) while the collective is still waiting, before dist.timeout_seconds ends it.

Why a thread that samples the main thread's Python frame, not a timer around each collective: a rank that never
arrives (asleep, in a long loop, in another collective) is not in the collective to time it, and a rank on a GPU
waits in whatever synchronizes (`loss.item()`), not in the collective's call. A blocked collective releases the
GIL, so the thread runs while the main thread waits. One sample a second costs nothing the step would notice
(BENCHMARKS.md: the recording's cost).

A rank that torchrun stops (SIGTERM, after another rank died) records itself first, whichever thread hears it:
SIGTERM's handler cannot run while the main thread waits in a collective, but the signal's byte reaches this thread
through signal.set_wakeup_fd, and the thread writes the snapshot and ends the process as SIGTERM would; where the
main thread is free (a peer's closed connection raised in it), the handler writes it before it ends the process.

The ranks meet through files (`<folder>/hang/`): the run directory for `lab train`, shared by the nodes of a
cluster that shares it; a rank on a node that does not share it still writes its own and is named by the others
as having left no record.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lab import atomic
from lab.errors import LabError
from lab.run.cluster import flight, hang

REQUEST = "request"  # in <folder>/hang/: a rank stalled; every rank writes its snapshot
STOP = "stop"  # in <folder>/hang/: a named hang outlived its stop time (a watched script's); every rank ends
STOPPED_EXIT = 3  # the exit of a rank ended that way
POLL_SECONDS = 1.0
GATHER_SECONDS = 5.0  # how long the asking rank waits for the others' snapshots
STOPPED_BY_SIGTERM = "stopped by SIGTERM (torchrun stops the others when a rank fails)"  # a record's reason


def default_folder() -> Path:
    job = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT") or str(os.getppid())
    return Path(tempfile.gettempdir()) / f"lab-hang-{job}"


class Watchdog:
    def __init__(
        self,
        rank: int,
        world_size: int,
        stall_seconds: float,
        folder: Path | None = None,
        on_diagnosis: Callable[[dict[str, Any]], None] | None = None,
        knob: str = "dist.hang_seconds",  # what set stall_seconds, in the diagnosis' words
    ) -> None:
        self.rank, self.world_size, self.stall_seconds = rank, world_size, stall_seconds
        given = folder or os.environ.get(hang.FOLDER_ENV)
        self.folder: Path | None = Path(given) if given else None
        self.on_diagnosis = on_diagnosis
        self.knob = knob
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dumped_at = 0.0
        self._started_at = 0.0
        self._stopping = False  # this rank asked every rank to end: it ends last
        # the main thread's failure path, its SIGTERM handler (which can run inside that path) and this thread's
        # SIGTERM may all come to dump: reentrant, so a handler that interrupts the main thread's dump still writes
        self._dumping = threading.RLock()
        self._wakeup: tuple[int, int] | None = None  # the pipe SIGTERM's byte arrives on
        self._restore: tuple[Any, int] | None = None  # SIGTERM's handler and the wakeup fd before ours

    # ------------------------------------------------------------------ where
    def where(self) -> Path:
        if self.folder is None:
            self.folder = default_folder()
        return self.folder

    def _request(self) -> Path:
        return self._asked(REQUEST)

    # ------------------------------------------------------------------ lifecycle
    def _asked(self, name: str) -> Path:
        return self.where() / hang.SNAPSHOTS / name

    def start(self) -> Watchdog:
        self._started_at = time.time()
        if self.folder is not None:  # an earlier attempt's records in the same run directory
            hang.snapshot_path(self.folder, self.rank).unlink(missing_ok=True)
            if self.rank == 0:
                self._request().unlink(missing_ok=True)
                self._asked(STOP).unlink(missing_ok=True)
        self._watch_sigterm()
        self._thread = threading.Thread(target=self._run, name="lab-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._restore is not None:
            handler, fd = self._restore
            signal.signal(signal.SIGTERM, handler)
            signal.set_wakeup_fd(fd)
            self._restore = None
        if self._wakeup is not None:
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None

    def _watch_sigterm(self) -> None:
        """SIGTERM's byte to this thread's pipe, where the default action was to die (nobody else handles it)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_end)
            os.close(write_end)
            return
        self._wakeup = (read_end, write_end)
        self._restore = (signal.SIG_DFL, previous_fd)
        signal.signal(signal.SIGTERM, self._terminated)

    def stop_every_rank(self) -> None:
        """Every rank that shares the folder ends within a poll (STOPPED_EXIT, its record kept); this one, which
        asked, is left for its caller to end after them, so the others leave before a closed connection raises."""
        self._stopping = True
        path = self._asked(STOP)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def dump(self, reason: str, overwrite: bool = True, failed: bool = False) -> Path | None:
        """This rank's snapshot into the folder; never raises (it runs on the way out of a failure).
        `overwrite=False`: kept where this rank already wrote one (a stall's is the one that says where)."""
        with self._dumping:
            if not overwrite and self._dumped_at:
                return None
            try:
                snap = flight.snapshot(reason, failed=failed)
                snap["world_size"] = self.world_size
                path = hang.snapshot_path(self.where(), self.rank)
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic.write_text(path, json.dumps(snap, default=str) + "\n")
                self._dumped_at = time.time()
                return path
            except Exception as exc:  # a full disk must not hide the error that brought us here
                print(f"lab: rank {self.rank} could not record its collectives: {exc}", file=sys.stderr, flush=True)
                return None

    # ------------------------------------------------------------------ the thread
    def _wait(self) -> bool:
        """One poll's wait; False once stopped. A SIGTERM meanwhile: this rank's record, then the end SIGTERM
        would have been (exit 128 + 15)."""
        if self._wakeup is None:
            return not self._stop.wait(POLL_SECONDS)
        ready, _, _ = select.select([self._wakeup[0]], [], [], POLL_SECONDS)
        if ready and signal.SIGTERM in os.read(self._wakeup[0], 64) and not self._stop.is_set():
            self.dump(STOPPED_BY_SIGTERM, overwrite=False)
            os._exit(128 + signal.SIGTERM)
        return not self._stop.is_set()

    def _terminated(self, signum: int, frame: Any) -> None:
        """SIGTERM in the main thread, when it was free to take it: this rank's record, then the way out SIGTERM's
        default would have been. Why here and not only in the with-block's failure path: that path records an
        error, not SystemExit, and it stops this watchdog before the thread reads the signal's byte, so a rank
        whose collective had raised (a dead peer's closed connection) and that took SIGTERM before or during its
        record left none and was named dead (exit code 143) among the waiting (a clean clone, 2026-12-06). Taken
        inside an except block (the signal interrupted the failure path), the last collective raised: `failed`."""
        self.dump(STOPPED_BY_SIGTERM, overwrite=False, failed=raised_failure(sys.exc_info()[1]))
        raise SystemExit(128 + signum)

    def _run(self) -> None:
        last_key, since, stalled = None, time.monotonic(), False
        while self._wait():
            if not self._stopping and _mtime(self._asked(STOP)) > self._started_at:
                self.dump("ended with the hang named above", overwrite=False)
                os._exit(STOPPED_EXIT)
            key = main_position()
            now = time.monotonic()
            if key != last_key:
                last_key, since, stalled = key, now, False
            elif not stalled and now - since >= self.stall_seconds:
                stalled = True
                self.dump(f"no progress for {self.stall_seconds:g} s")
                self._lead()
                continue
            elif stalled and not self._request().exists():
                self._lead()  # a leader that heard too few ranks to name a hang let go: ask again
                continue
            if _mtime(self._request()) > self._dumped_at:
                self.dump("asked by a stalled rank")

    def _lead(self) -> None:
        """Ask every rank for its snapshot; the first to ask gathers them and says what it found."""
        request = self._request()
        try:
            request.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(request, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # another rank leads
        except OSError:
            return
        deadline = time.monotonic() + GATHER_SECONDS
        while time.monotonic() < deadline and not self._stop.is_set():
            if len(hang.read_snapshots(self.where())) >= self.world_size:
                break
            time.sleep(0.2)
        snapshots = hang.read_snapshots(self.where())
        diagnosis = hang.diagnose(snapshots, self.world_size)
        if not any(r["state"] == "waiting" for r in diagnosis["ranks"]):
            if len(snapshots) < self.world_size:
                # some rank had not answered (a loaded machine; CI saw the rank asleep lead, hear only itself and
                # name nothing, and the run wait for gloo's 30 minutes): let go, so a stalled rank asks again
                request.unlink(missing_ok=True)
            return  # a slow step, not a collective that waits: nothing to say
        diagnosis["seen_by"] = f"rank {self.rank}'s watchdog after {self.stall_seconds:g} s ({self.knob})"
        path = hang.write(self.where(), diagnosis)
        header = f"lab: no progress for {self.stall_seconds:g} s ({self.knob}); {path}"
        print(hang.render(diagnosis, header), file=sys.stderr, flush=True)
        if self.on_diagnosis is not None:
            self.on_diagnosis(diagnosis)


def raised_failure(exc: BaseException | None) -> bool:
    """Whether an exception on a rank's way out is a failure its record keeps, the last collective taken as the one
    that raised: an error; not a refusal (a LabError, said at once) nor an interrupt. One rule for the with-block's
    failure path (lab.run.cluster.dist.initialized) and for a SIGTERM that interrupts it."""
    return isinstance(exc, Exception) and not isinstance(exc, LabError)


def _mtime(path: Path) -> float:
    """When the file was last written; 0 where it is not."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def main_position() -> tuple[int, int, int] | None:
    """Where the main thread is: its innermost frame and instruction (the same for as long as it waits)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    return (id(frame.f_code), frame.f_lasti, id(frame)) if frame is not None else None
