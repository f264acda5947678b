"""What an observed rank keeps: its trace file (a JSON line an event, flushed at once, one lock for autograd's
threads) and the measurements the observer takes of the learner's objects (model state bytes, a tensor's values,
each wrapped model at exit). lab.course.exercises.observe patches torch and writes through a Recorder.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

HERE = os.path.dirname(__file__)  # the observer's own frames (its wrappers) are never "where" a call came from
MAX_VALUES = 4096  # a tensor recorded element by element up to this many; beyond, its sum and norm only
PENDING_LOSSES = 512  # device losses held unread at most: then read together (one host sync per this many steps)


class Recorder:
    """This rank's trace file, written a line at a time (one lock: DDP's hooks run on autograd's threads)."""

    def __init__(self, folder: str, rank: int, learner_file: str | None) -> None:
        os.makedirs(folder, exist_ok=True)
        self._file = open(os.path.join(folder, f"rank-{rank}.jsonl"), "a", buffering=1)
        self._lock = threading.Lock()
        self.rank = rank
        self.learner_file = os.path.realpath(learner_file) if learner_file else None
        self.sequence = 0
        self.models: list[Any] = []  # modules wrapped in DDP / DataParallel / fully_shard, for "end"
        self.inside = threading.local()  # depth of recorded collectives on this thread
        self.buckets: dict[int, Any] = {}  # each DDP bucket's latest tensor, held to the end (see _counting_allreduce)
        self.pending: list[Any] = []  # the device's losses not read yet: reading one is a host sync
        self.unfinished: deque[tuple[int, str, Any]] = deque()  # device collectives returned but not done yet
        self.losses_read = 0  # device losses read so far (the index of pending[0])
        self.count_ddp = True  # DDP's buckets counted through a comm hook of the observer's (a probe may say no)

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "t": round(time.time(), 6), **fields}, default=str)
        with self._lock:
            self._file.write(line + "\n")

    def loss(self, value: Any) -> None:
        """A training loss, recorded in its place among the events. A CUDA loss is not read here: float() would make
        the learner's step loop wait for the device at every forward. It is kept, its event says its index, and the
        values are read together at the rank's end (or every PENDING_LOSSES), where a sync costs nothing."""
        if not getattr(value, "is_cuda", False):
            self.write("loss", v=float(value))
            return
        self.write("loss", i=self.losses_read + len(self.pending))
        self.pending.append(value)
        self.settle()
        if len(self.pending) >= PENDING_LOSSES:
            self.read_losses()

    def read_losses(self) -> None:
        """The device losses kept so far, read at once: one event {"e": "loss_values", "first": i, "v": [...]}."""
        if not self.pending:
            return
        import torch

        values = torch.stack([v.float() for v in self.pending]).cpu().tolist()
        self.write("loss_values", first=self.losses_read, v=values)
        self.losses_read += len(self.pending)
        self.pending = []

    def left(self, seq: int, op: str, tensors: Iterable[Any], work: Any = None) -> None:
        """A recorded collective returned to the learner's code. On the CPU (gloo) that is when it is done: its exit
        is written now. On CUDA (NCCL) a call returns when it is enqueued (barrier excepted), so a rank stuck in an
        all-reduce would look as if it had left it: its exit waits for the device instead (the async call's Work,
        else an event on the current stream, which a synchronous call has made wait for the collective) and is
        written once that is done, in order, whenever the observer next looks (settle)."""
        marker = finished_marker(tensors, work)
        if marker is None and not self.unfinished:
            self.write("coll", phase="exit", seq=seq, op=op)
            return
        self.unfinished.append((seq, op, marker))
        self.settle()

    def settle(self) -> None:
        """The exits of the device collectives that are done now (they complete in the order they were enqueued)."""
        while self.unfinished and done(self.unfinished[0][2]):
            seq, op, _ = self.unfinished.popleft()
            self.write("coll", phase="exit", seq=seq, op=op)

    def next_sequence(self) -> int:
        with self._lock:
            self.sequence += 1
            return self.sequence

    def stopped(self, frame: Any) -> None:
        """Stopped from outside (SIGTERM: the grader's limit, or torchrun after another rank failed): where the main
        thread was, the line of a rank that never came. Written past the lock and the file's buffer (the signal may
        have come while this thread held them), on a line of its own."""
        line = json.dumps({"e": "stopped", "t": round(time.time(), 6), "where": self.where_in(frame)}, default=str)
        os.write(self._file.fileno(), f"\n{line}\n".encode())

    def where(self) -> str:
        """The learner's line that led here: the innermost frame in their file, else the innermost outside torch."""
        return self.where_in(sys._getframe(2))

    def where_in(self, frame: Any) -> str:
        """where() from `frame` outwards."""
        fallback = None
        while frame is not None:
            filename = frame.f_code.co_filename
            if self.learner_file and os.path.realpath(filename) == self.learner_file:
                return f"{os.path.basename(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
            if fallback is None and "/torch/" not in filename and os.path.dirname(filename) != HERE:
                fallback = f"{os.path.basename(filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
        return fallback or "?"


class Handle:
    """What an async collective (async_op=True) hands the learner: torch's Work, whose wait() also records the
    collective's exit. Until the learner waits, the collective is in flight: a rank that never waits, or waits on a
    peer that never came, is seen waiting in it; and the own-ddp check reads whether the backward went on computing
    while it was in flight (its exit after the next gradient) or waited for it at once."""

    def __init__(self, work: Any, rec: Recorder, seq: int, op: str, tensors: list[Any]) -> None:
        self._work, self._rec, self._seq, self._op, self._tensors = work, rec, seq, op, tensors
        self._left = False

    def _waiting(self) -> None:
        if not self._left:
            self._rec.write("coll", phase="wait", seq=self._seq, op=self._op, where=self._rec.where())

    def _done(self) -> None:
        if not self._left:
            self._left = True
            self._rec.left(self._seq, self._op, self._tensors, work=self._work)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._waiting()
        result = self._work.wait(*args, **kwargs)
        self._done()
        return result

    def get_future(self) -> Any:
        return _Future(self._work.get_future(), self)

    def __getattr__(self, name: str) -> Any:  # is_completed, exception, source_rank, ...: torch's Work's own
        return getattr(self._work, name)


class _Future:
    """A Handle's get_future(): waiting on it is waiting on the collective."""

    def __init__(self, future: Any, handle: Handle) -> None:
        self._future, self._handle = future, handle

    def wait(self) -> Any:
        self._handle._waiting()
        result = self._future.wait()
        self._handle._done()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


def finished_marker(tensors: Iterable[Any], work: Any = None) -> Any:
    """What says a collective on these tensors is done: None on the CPU (it is, when it returns); on CUDA the async
    call's Work, else an event recorded on the current stream."""
    if not any(getattr(t, "is_cuda", False) for t in tensors):
        return None
    if work is not None and hasattr(work, "is_completed"):
        return work
    import torch

    event = torch.cuda.Event()
    event.record()
    return event


def done(marker: Any) -> bool:
    if marker is None:
        return True
    return bool(marker.is_completed() if hasattr(marker, "is_completed") else marker.query())


def local(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard on this rank


def state_bytes(optimizer: Any) -> int:
    import torch

    total = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            total += local(p).numel() * p.element_size()
            if p.grad is not None:
                total += local(p.grad).numel() * p.grad.element_size()
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    total += local(value).numel() * value.element_size()
    return total


def peak_bytes() -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def values(tensor: Any) -> dict[str, Any]:
    flat = local(tensor).detach().float().cpu().flatten()
    found: dict[str, Any] = {"sum": float(flat.sum()), "norm": float(flat.norm()), "numel": flat.numel()}
    if flat.numel() <= MAX_VALUES:
        found["values"] = flat.tolist()
    return found


def end(rec: Recorder) -> None:
    rec.read_losses()  # reads the device: what was enqueued before it is done
    rec.settle()
    models: list[dict[str, Any]] = []
    for model in rec.models:
        try:
            models.append(
                {
                    "parameters": {n: values(p) for n, p in model.named_parameters()},
                    "buffers": {n: values(b) for n, b in model.named_buffers()},
                }
            )
        except Exception as exc:  # a model torch already tore down: say so rather than fail the learner's exit
            models.append({"error": str(exc)[:200]})
    rec.write("end", models=models)


class Tee(io.TextIOBase):
    """The rank's stdout, each complete line also recorded."""

    def __init__(self, stream: Any, rec: Recorder) -> None:
        self._stream, self._rec, self._partial = stream, rec, ""

    def write(self, text: str) -> int:
        self._stream.write(text)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._rec.write("print", text=line[:500])
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding
