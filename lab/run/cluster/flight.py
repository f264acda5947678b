"""What this rank's collectives were: PyTorch's Flight Recorder where the installed torch has it, else a record of
the lab's own; read as one snapshot (the analysis of a hang, lab.run.cluster.hang, reads the ranks' snapshots).

The Flight Recorder (torch >= 2.8 on gloo, NCCL since 2.4) keeps a ring of every collective a process group
enqueued: its sequence number, operation, sizes and the Python frames that called it, and per group the last
sequence number enqueued and completed. It must be on before the first process group is made
(TORCH_FR_BUFFER_SIZE); it dumps nothing by itself, so the lab reads it when a rank stalls or a collective raises.
There are two recorders: the CPU-event one that gloo writes, dumped by `_dump_fr_trace`, and NCCL's own, dumped by
`_dump_nccl_trace` (torch's distributed/debug/_debug_handlers.py serves the same as dump_nccl_trace_json). Each
dump says nothing of the other's groups (a gloo group's collectives are not in NCCL's dump, and an NCCL group's
not in the CPU one), so a snapshot reads both and keeps each group from the one that holds it. torch 2.6 and 2.7
have NCCL's only: for gloo there the lab wraps torch.distributed's collectives in Python instead, which sees the
calls made from Python (a DDP bucket's all-reduce, made in C++, is not among them).

    flight.enable()                 # before init_process_group
    flight.snapshot(reason="...")   # this rank's record: {"source", "groups", "entries", "stack"}

LAB_FLIGHT_RECORDER=0 turns recording off (the benchmark's "without" side): TORCH_FR_BUFFER_SIZE=0, since torch
2.14 records 2000 entries by default when the variable is unset. Its cost is in BENCHMARKS.md.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
SWITCH_ENV = "LAB_FLIGHT_RECORDER"  # 0: no record at all
BUFFER_ENTRIES = 512  # collectives kept per process: many steps of DDP buckets; a dump reads them all (~0.1 s)
# The recorders a snapshot reads: the CPU-event one (gloo; torch >= 2.8) and NCCL's own (torch >= 2.4)
DUMPS = ("_dump_fr_trace", "_dump_nccl_trace")
ENTRIES_KEPT = 6  # per group in a snapshot: the one in flight and the few before it
# Frames that are not the line a reader wants: torch's own, and the lab's thin wrappers of a collective.
NOT_THE_CALLER = (
    str(Path(torch.__file__).parent),
    str(Path(__file__).parent / "dist.py"),
    str(Path(__file__)),
    sysconfig.get_paths()["stdlib"] + os.sep,  # contextlib's __exit__ around a with-block's closing barrier
)

# torch.distributed's functions the Python record wraps (where the Flight Recorder is missing)
WRAPPED = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
)


def on() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip() != "0"


def recording() -> str | None:
    """What records this process's collectives now: 'flight recorder', 'lab record' or None. Unset, the buffer is
    torch's default: recording, from torch 2.14 (enable() always sets it, on or off)."""
    if not on():
        return None
    if has_flight_recorder() and int(os.environ.get(BUFFER_ENV) or 2000) > 0:
        return "flight recorder"
    return "lab record" if _PythonRecord.installed else None


def has_flight_recorder() -> bool:
    return hasattr(torch._C._distributed_c10d, "_dump_fr_trace")


def enable() -> str | None:
    """Turn recording on for the groups this process will make: 'flight recorder', 'lab record' or None (off:
    the buffer set to 0, which is off; unset would be torch's default, on)."""
    if not on():
        os.environ[BUFFER_ENV] = "0"
        return None
    os.environ.setdefault(BUFFER_ENV, str(BUFFER_ENTRIES))  # NCCL's recorder too, on torch 2.6 and 2.7
    if has_flight_recorder():
        return "flight recorder" if int(os.environ[BUFFER_ENV] or 0) > 0 else None
    _PythonRecord.install()
    return "lab record"


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame outside torch (frames innermost first): the line that called the collective."""
    for f in frames:
        name = str(f.get("filename", ""))
        if name and not name.startswith(NOT_THE_CALLER) and not name.startswith("<"):
            return {"file": short_path(name), "line": int(f.get("line", 0)), "function": str(f.get("name", ""))}
    return None


def short_path(path: str) -> str:
    """A path under the working directory as the user typed it (tests/x.py), others whole."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def main_stack(limit: int = 40) -> list[dict[str, Any]]:
    """The main thread's Python frames now, innermost first (a watchdog thread reads another thread's stack)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    stack = traceback.extract_stack(frame, limit=limit) if frame is not None else []
    return [{"filename": f.filename, "line": f.lineno or 0, "name": f.name} for f in reversed(stack)]


def snapshot(reason: str, failed: bool = False) -> dict[str, Any]:
    """This rank's record now: each group's last enqueued and completed collective, the last few entries, and
    where the main thread is (user frames first). `failed`: the last collective raised (the Flight Recorder
    counts it completed; for a hang it is the one this rank was in)."""
    groups, entries, source = _from_flight_recorder() if int(os.environ.get(BUFFER_ENV) or 0) > 0 else ({}, [], None)
    if _PythonRecord.installed:  # torch < 2.8: a gloo group is the Python record's, an NCCL group the recorder's
        python_groups, python_entries, python = _PythonRecord.read()
        fresh = {g: s for g, s in python_groups.items() if g not in groups}
        groups.update(fresh)
        entries += [e for e in python_entries if e["group"] in fresh]
        source = source or python
    if failed and entries:
        last = max(entries, key=lambda e: e.get("created", 0))
        status = groups.get(last["group"])
        if status and status["completed"] >= last["seq"] and not last["p2p"]:
            status["completed"] = last["seq"] - 1
    stack = main_stack()
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),
        "reason": reason,
        "source": source,
        "groups": groups,
        "entries": entries,
        "where": user_frame(stack),
        "stack": [f"{f['filename']}:{f['line']} {f['name']}" for f in stack[:12]],
    }


def _dump(name: str) -> dict[str, Any] | None:
    """One recorder's dump (`_dump_fr_trace` or `_dump_nccl_trace`), None where this torch has none."""
    function = getattr(torch._C._distributed_c10d, name, None)
    if function is None:
        return None
    try:
        dumped: dict[str, Any] = pickle.loads(function(True, True, False))
    except Exception:  # a build without NCCL, or a recorder that cannot dump now: it holds nothing for the lab
        return None
    return dumped


def _from_flight_recorder() -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """Both recorders read (DUMPS): each group's status and entries from the dump that holds them."""
    groups: dict[str, dict[str, int]] = {}
    kept: dict[str, deque[dict[str, Any]]] = {}
    for dump in filter(None, map(_dump, DUMPS)):
        retired = _retired_through(dump.get("entries") or [])
        for pg, st in (dump.get("pg_status") or {}).items():
            # sequence numbers start at 1; the recorder says -1 for none yet (a rank stuck in its group's first)
            status = {
                "enqueued": max(0, int(st.get("last_enqueued_collective", -1))),
                "completed": max(0, int(st.get("last_completed_collective", -1))),
            }
            status["completed"] = min(status["enqueued"], max(status["completed"], retired.get(str(pg), 0)))
            if str(pg) not in groups or status["enqueued"] > groups[str(pg)]["enqueued"]:
                groups[str(pg)] = status  # an empty status of the other recorder does not hide this one's
        for e in dump.get("entries") or []:
            pg = str(e.get("pg_id", e.get("process_group", ("?",))[0]))
            kept.setdefault(pg, deque(maxlen=ENTRIES_KEPT)).append(e)
    if not groups and not kept:
        return {}, [], None
    entries = []
    for pg, few in kept.items():
        for e in few:
            op = str(e.get("profiling_name", "?")).split(":")[-1]
            entries.append(
                {
                    "group": pg,
                    "group_name": (e.get("process_group") or ("", ""))[1],
                    "seq": int(e.get("collective_seq_id") or e.get("p2p_seq_id") or 0),
                    "p2p": bool(e.get("is_p2p")),
                    "op": op,
                    "sizes": e.get("input_sizes"),
                    "dtypes": e.get("input_dtypes"),
                    "where": user_frame(e.get("frames") or []),
                    "created": int(e.get("time_created_ns") or 0),
                }
            )
    return groups, entries, "flight recorder"


def _retired_through(entries: list[dict[str, Any]]) -> dict[str, int]:
    """Per group, the last collective before the first one not retired, from the entries themselves.

    gloo's last_completed_collective is not to be trusted alone: each of its two worker threads writes the number
    of the collective it ran after running it, unordered, so a thread that finishes #1 late overwrites #2's 2 with
    1, and a rank waiting in #3 reads as waiting in #2 (CI saw it on 2 loaded cores). Each entry's `retired` is its
    own and so stays right. Groups whose entries do not say (an older dump) are left out.

    >>> _retired_through([{"pg_id": 0, "collective_seq_id": s, "is_p2p": False, "retired": s < 3} for s in (1, 2, 3)])
    {'0': 2}
    """
    seqs: dict[str, list[tuple[int, bool]]] = {}
    for e in entries:
        if e.get("is_p2p") or "retired" not in e or not e.get("collective_seq_id"):
            continue
        seqs.setdefault(str(e.get("pg_id", (e.get("process_group") or ("?",))[0])), []).append(
            (int(e["collective_seq_id"]), bool(e["retired"]))
        )
    through = {}
    for pg, done in seqs.items():
        waiting = [seq for seq, retired in done if not retired]
        through[pg] = min(waiting) - 1 if waiting else max(seq for seq, _ in done)
    return through


class _PythonRecord:
    """torch.distributed's collectives wrapped in Python (torch < 2.8 on gloo): each call numbered per group, its
    sizes and the caller's frame kept, completed when the call returns (async calls: when enqueued)."""

    installed = False
    lock = threading.Lock()
    groups: dict[str, dict[str, int]] = {}
    entries: deque[dict[str, Any]] = deque(maxlen=ENTRIES_KEPT * 4)

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        import torch.distributed as tdist

        for name in WRAPPED:
            original = getattr(tdist, name, None)
            if original is not None:
                setattr(tdist, name, cls._wrap(name, original))
        cls.installed = True

    @classmethod
    def _wrap(cls, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            pg = "0" if group is None else str(getattr(group, "group_name", id(group)))
            tensors = [a for a in args if hasattr(a, "shape")]
            callers = traceback.extract_stack(sys._getframe(1), limit=8)
            with cls.lock:
                status = cls.groups.setdefault(pg, {"enqueued": 0, "completed": 0})
                status["enqueued"] += 1
                seq = status["enqueued"]
                cls.entries.append(
                    {
                        "group": pg,
                        "group_name": "default_pg" if group is None else pg,
                        "seq": seq,
                        "p2p": op in ("send", "recv"),
                        "op": op,
                        "sizes": [list(t.shape) for t in tensors],
                        "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
                        "where": user_frame(
                            [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(callers)]
                        ),
                        "created": time.monotonic_ns(),
                    }
                )
            result = original(*args, **kwargs)
            with cls.lock:
                status["completed"] = max(status["completed"], seq)
            return result

        return recorded

    @classmethod
    def read(cls) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        with cls.lock:
            return {k: dict(v) for k, v in cls.groups.items()}, list(cls.entries), "lab record"
