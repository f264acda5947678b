"""The grader stops a learner's run as hung before its limit when the ranks' traces stand still while a rank waits
in a collective (lab.course.exercises.grading.Stall), and never for a rank that only computes. Real trace files in
a folder, written as the observer writes them; the stall shortened to a fraction of a second."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lab.course.exercises import grading
from lab.run.cluster.child_output import StackFolder

IN_A_COLLECTIVE = {"e": "coll", "phase": "enter", "seq": 1, "op": "all_reduce", "where": "f.py:3 in main"}


def trace(folder: Path, rank: int, *events: dict) -> None:
    with (folder / f"rank-{rank}.jsonl").open("a") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")


def test_a_rank_in_a_collective_with_no_trace_moving_is_a_stall(tmp_path):
    trace(tmp_path, 0, {"e": "start"}, IN_A_COLLECTIVE)
    trace(tmp_path, 1, {"e": "start"})
    stall = grading.Stall(tmp_path, 2, seconds=0.3)
    assert not stall()  # the first look: everything is new
    time.sleep(0.4)
    assert stall() and stall.fired


def test_a_trace_that_moves_is_no_stall(tmp_path):
    trace(tmp_path, 0, {"e": "start"}, IN_A_COLLECTIVE)
    stall = grading.Stall(tmp_path, 1, seconds=0.3)
    for _ in range(4):
        stall()
        time.sleep(0.15)
        trace(tmp_path, 0, {"e": "loss", "v": 1.0})
    assert not stall() and not stall.fired


def test_ranks_that_only_compute_are_never_a_stall_however_long(tmp_path):
    trace(tmp_path, 0, {"e": "start"}, IN_A_COLLECTIVE, {"e": "coll", "phase": "exit", "seq": 1, "op": "all_reduce"})
    stall = grading.Stall(tmp_path, 1, seconds=0.1)
    stall()
    time.sleep(0.3)
    assert not stall() and not stall.fired


def test_torchruns_traceback_of_its_own_stop_is_left_out_and_any_other_kept():
    kept: list[str] = []

    class Sink:
        def write(self, text: str) -> None:
            kept.append(text)

        def flush(self) -> None:
            pass

    folder = StackFolder(Sink())
    stopped = ["Traceback (most recent call last):\n", '  File "run.py", line 9, in main\n', "    run(args)\n"]
    for line in [*stopped, "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 2\n"]:
        folder.relay(line)
    other = [*stopped, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n", "after\n"]
    for line in other:
        folder.relay(line)
    folder.flush()
    assert "".join(kept) == "".join(other)
