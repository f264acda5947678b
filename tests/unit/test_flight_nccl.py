"""The hang record on NCCL, proved on the CPU where it can be (no GPU here: NCCL's recorder is faked by its dump,
in the shape torch 2.14's `_dump_nccl_trace` pickles, and the test says so):

- the snapshot reads NCCL's own recorder (`_dump_nccl_trace`), not only the CPU-event one gloo writes
  (`_dump_fr_trace`), which holds nothing of an NCCL group;
- recording off is off: LAB_FLIGHT_RECORDER=0 sets TORCH_FR_BUFFER_SIZE=0 (torch 2.14 records 2000 entries when
  the variable is unset);
- the collective an NCCL rank waits in is `completed + 1`, not the last it enqueued (NCCL enqueues asynchronously,
  so a rank queues bucket all-reduces past the one that is stuck);
- on gloo, the collective a rank waits in is read from its entries' `retired` as well as the group's
  last_completed_collective, which gloo's two worker threads write unordered (CI: a rank waiting in #3 was named
  as waiting in #2, its #1's thread having written 1 after #2's wrote 2).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from lab.run.cluster import flight, hang

DDP_FILE = str(Path(torch.__file__).parent / "nn" / "parallel" / "distributed.py")  # torch's frame: not the caller


def _entry(seq: int, name: str, sizes: list, frames: list[dict[str, Any]], **state: Any) -> dict[str, Any]:
    """One collective of group 0 as the recorders pickle it (torch 2.10 and later)."""
    return {
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "is_p2p": False,
        "profiling_name": name,
        "input_sizes": sizes,
        "input_dtypes": ["Float"] * len(sizes),
        "frames": frames,
        "time_created_ns": seq,
        **state,
    }


def _dump(entries: list[dict[str, Any]], enqueued: int, completed: int) -> dict[str, Any]:
    status = {"last_enqueued_collective": enqueued, "last_completed_collective": completed}
    return {"version": "2.10", "pg_status": {"0": status}, "entries": entries}


def _nccl_dump(enqueued: int, completed: int, ops: dict[int, str] | None = None) -> dict[str, Any]:
    """An NCCL recorder's dump: pg 0's status and one entry per enqueued collective, each with the frames that
    called it (innermost first)."""
    ops = ops or {}
    entries = [
        _entry(
            seq,
            f"nccl:{ops.get(seq, 'all_reduce')}",
            [[1024]],
            [
                {"filename": DDP_FILE, "line": 1, "name": "_run_ddp"},
                {"filename": "train.py", "line": 40 + seq, "name": "step"},
            ],
            state="scheduled" if seq > completed else "completed",
        )
        for seq in range(1, enqueued + 1)
    ]
    return _dump(entries, enqueued, completed)


def test_the_snapshot_reads_ncclss_recorder_where_the_cpu_one_holds_nothing(monkeypatch):
    dumps = {
        "_dump_fr_trace": {"version": "2.10", "pg_status": {}, "entries": []},
        "_dump_nccl_trace": _nccl_dump(7, 4),
    }
    monkeypatch.setattr(flight, "_dump", lambda name: dumps[name])
    monkeypatch.setenv(flight.BUFFER_ENV, "512")
    snap = flight.snapshot("stalled")
    assert snap["source"] == "flight recorder"
    assert snap["groups"] == {"0": {"enqueued": 7, "completed": 4}}
    assert [e["seq"] for e in snap["entries"]] == [2, 3, 4, 5, 6, 7]  # the last ENTRIES_KEPT
    assert snap["entries"][0]["where"] == {"file": "train.py", "line": 42, "function": "step"}
    # before: only _dump_fr_trace was read, and on a GPU the snapshot held nothing
    monkeypatch.setattr(flight, "DUMPS", ("_dump_fr_trace",))
    assert flight.snapshot("stalled")["groups"] == {}


def test_both_recorders_are_read_on_this_torch_and_gloos_is_the_cpu_one():
    """The real dumps of this torch (a CUDA build: NCCL's recorder exists, empty with no NCCL group)."""
    c10d = torch._C._distributed_c10d
    for name in flight.DUMPS:
        assert hasattr(c10d, name), f"torch {torch.__version__} has no {name}"
        dump = flight._dump(name)
        assert dump is not None and isinstance(dump.get("entries", []), list)


def test_recording_off_sets_the_buffer_to_zero_and_says_so(monkeypatch):
    # enable() writes os.environ itself (the process's groups read it when made), which monkeypatch does not undo
    # for a variable that was unset: the whole environment is put back after, or this worker's later subprocesses
    # would inherit TORCH_FR_BUFFER_SIZE=0 and record nothing (CI: the device check's hang-record step)
    with mock.patch.dict(os.environ):
        monkeypatch.delenv(flight.BUFFER_ENV, raising=False)
        monkeypatch.setenv(flight.SWITCH_ENV, "0")
        assert flight.enable() is None and flight.recording() is None
        assert os.environ[flight.BUFFER_ENV] == "0"  # unset would be torch's default: 2000 entries, recording
        monkeypatch.setenv(flight.SWITCH_ENV, "1")
        monkeypatch.delenv(flight.BUFFER_ENV, raising=False)
        assert flight.recording() == "flight recorder"  # unset: torch 2.14 records by default, and says so
        assert flight.enable() == "flight recorder" and os.environ[flight.BUFFER_ENV] == str(flight.BUFFER_ENTRIES)
        monkeypatch.undo()


def _snap(dump: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setattr(flight, "_dump", lambda name: dump if name == "_dump_nccl_trace" else None)
    monkeypatch.setenv(flight.BUFFER_ENV, "512")
    return flight.snapshot("stalled")


def test_an_nccl_rank_waits_in_completed_plus_one_not_the_last_it_enqueued(monkeypatch):
    # ranks 0 and 1 queued all-reduces #5-#7 (DDP's buckets) and completed #4; rank 2 never enqueued #5
    snaps = {0: _snap(_nccl_dump(7, 4), monkeypatch), 1: _snap(_nccl_dump(7, 4), monkeypatch)}
    snaps[2] = {**_snap(_nccl_dump(4, 4), monkeypatch), "where": {"file": "train.py", "line": 30, "function": "load"}}
    d = hang.diagnose(snaps, world_size=3)
    assert d["collective"] == {"seq": 5, "op": "all_reduce"}
    assert [(r["rank"], r["state"]) for r in d["ranks"]] == [(0, "waiting"), (1, "waiting"), (2, "elsewhere")]
    assert d["summary"].startswith("ranks 0, 1 wait in all_reduce #5 at train.py:45 in step")
    assert "rank 2 never came (at train.py:30 in load)" in d["summary"]


def test_a_mismatch_on_nccl_is_named_at_the_stuck_number(monkeypatch):
    # rank 1's #5 is a broadcast where rank 0's is an all-reduce; both queued more behind it
    snaps = {
        0: _snap(_nccl_dump(7, 4), monkeypatch),
        1: _snap(_nccl_dump(6, 4, ops={5: "broadcast"}), monkeypatch),
        2: _snap(_nccl_dump(7, 4), monkeypatch),
    }
    d = hang.diagnose(snaps, world_size=3)
    assert [(r["rank"], r["state"], r["op"]) for r in d["ranks"]] == [
        (0, "waiting", "all_reduce"),
        (1, "mismatch", "broadcast"),
        (2, "waiting", "all_reduce"),
    ]


def test_the_dump_is_a_pickle_as_torchs_recorders_write_it():
    assert pickle.loads(pickle.dumps(_nccl_dump(2, 1)))["pg_status"]["0"]["last_enqueued_collective"] == 2


def _gloo_dump(ops: list[str], retired: int, last_completed: int) -> dict[str, Any]:
    """gloo's recorder as torch 2.14's `_dump_fr_trace` pickles it (seen in a real dump): every entry 'scheduled'
    (gloo records no events), `retired` once its worker ran it, and the group's last completed as the last worker
    to finish wrote it."""
    entries = [
        _entry(
            seq,
            f"gloo:{op}",
            [[1000]] if op == "all_reduce" else [],
            [{"filename": "plain_hang.py", "line": 34 if op == "all_reduce" else 35, "name": "main"}],
            state="scheduled",
            retired=seq <= retired,
        )
        for seq, op in enumerate(ops, 1)
    ]
    return _dump(entries, len(ops), last_completed)


def test_a_gloo_rank_is_placed_by_its_entries_retired_not_a_worker_threads_late_write(monkeypatch):
    # plain_hang.py --plant skip: rank 0 waits in all-reduce #3, rank 1 in barrier #3; both ran #1 and #2, but the
    # thread that ran #1 wrote its 1 last on each (as CI saw on rank 1 and a loaded run here on rank 0)
    def gloo(dump):
        monkeypatch.setattr(flight, "_dump", lambda name: dump if name == "_dump_fr_trace" else None)
        monkeypatch.setenv(flight.BUFFER_ENV, "512")
        return flight.snapshot("stalled")

    snaps = {
        0: gloo(_gloo_dump(["all_reduce"] * 3, retired=2, last_completed=1)),
        1: gloo(_gloo_dump(["all_reduce", "all_reduce", "barrier"], retired=2, last_completed=1)),
    }
    assert snaps[0]["groups"] == {"0": {"enqueued": 3, "completed": 2}}
    summary = hang.diagnose(snaps, world_size=2)["summary"]
    assert summary.startswith("rank 0 waits in all_reduce #3 at plain_hang.py:34 in main"), summary
    assert "rank 1 is in barrier #3 where the others are in all_reduce #3, at plain_hang.py:35 in main" in summary
    # before: the group's last completed alone, and rank 0 was said to wait in #2
    monkeypatch.setattr(flight, "_retired_through", lambda entries: {})
    assert "all_reduce #2" in hang.diagnose({0: gloo(_gloo_dump(["all_reduce"] * 3, 2, 1))}, 1)["summary"]


def test_a_leader_that_heard_too_few_ranks_to_name_a_hang_lets_go_so_another_asks_again(tmp_path, monkeypatch):
    """CI: the rank asleep in its data loading led, heard only itself within the gather, named nothing, and kept
    the request, so no other rank asked and the run waited for gloo's 30 minutes. Now it lets go; with every rank
    heard (a slow step, not a hang) the request stays and nobody asks again."""
    from lab.run.cluster import watchdog

    monkeypatch.setattr(watchdog, "GATHER_SECONDS", 0.3)
    asleep = {"rank": 1, "groups": {}, "entries": [], "where": {"file": "t.py", "line": 9, "function": "load"}}
    snaps = tmp_path / hang.SNAPSHOTS
    snaps.mkdir()
    (snaps / "rank-1.json").write_text(json.dumps(asleep))
    leader = watchdog.Watchdog(1, 2, 5.0, folder=tmp_path)
    leader._lead()
    assert not (snaps / watchdog.REQUEST).exists() and not (tmp_path / hang.DIAGNOSIS).exists()
    (snaps / "rank-0.json").write_text(json.dumps({**asleep, "rank": 0}))  # both heard, neither in a collective
    leader._lead()
    assert (snaps / watchdog.REQUEST).exists() and not (tmp_path / hang.DIAGNOSIS).exists()
