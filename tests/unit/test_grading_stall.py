"""The grader stops a learner's run as hung before its limit when the ranks' traces stand still while a rank waits
in a collective (lab.course.exercises.grading.Stall), and never for a rank that only computes. Real trace files in
a folder, written as the observer writes them; the stall shortened to a fraction of a second."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from lab.course.exercises import grading
from lab.run.cluster.child_output import StackFolder
from tests.conftest import PYTHON

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


def test_a_rank_asked_for_its_stack_names_its_line_in_the_learners_file(tmp_path):
    """stacks.arm in a real process (as the observer arms each rank), stacks.ask from outside, stacks.read: the
    main thread's innermost line in the learner's file. (The C++ block the signal exists for, DDP's forward, is
    graded for real in tests/distributed/test_exercise_convert.py.)"""
    import subprocess
    import sys

    from lab.course.exercises import stacks

    learner = tmp_path / "learner.py"
    learner.write_text("import time\n\n\ndef wait():\n    time.sleep(60)\n\n\nwait()\n")
    armed = f"from lab.course.exercises import stacks; stacks.arm({str(tmp_path)!r}, 0, {str(learner)!r}); "
    armed += f"import runpy; print('armed', flush=True); runpy.run_path({str(learner)!r}, run_name='__main__')"
    rank = subprocess.Popen([sys.executable, "-c", armed], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "armed"
        time.sleep(0.2)  # into its sleep
        stacks.ask(tmp_path, {0: rank.pid})
        assert stacks.read(tmp_path, 0) == "learner.py:5 in wait"
        assert rank.poll() is None  # asking does not stop it
    finally:
        rank.kill()
        rank.wait()


def test_a_run_at_its_limit_names_where_a_rank_blocked_in_c_was(tmp_path):
    """A rank blocked in C code with SIGTERM held back, as a rank inside torch's C++ (gloo's wait, DDP's forward)
    runs no Python handler: it cannot say where it was when stopped. The grader asks the stacks just before the
    limit (faulthandler's C handler answers), and the run's end names the line. One process: the observer as the
    grader starts it, no torchrun."""
    learner = tmp_path / "blocked.py"
    learner.write_text(
        "import ctypes\nimport os\nimport signal\n\n\ndef wait():\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n    r, w = os.pipe()\n"
        "    ctypes.CDLL(None).read(r, ctypes.create_string_buffer(1), 1)\n\n\nwait()\n"
    )
    run = grading.observed(learner, None, [], timeout_seconds=30)  # room for a loaded machine to start it
    assert run.timed_out, run.how_it_ended()
    assert "rank 0 was not in a collective (at blocked.py:9 in wait)" in run.how_it_ended(), run.how_it_ended()


def test_traces_that_grew_lately_are_moving_and_the_first_look_is_not_movement(tmp_path, monkeypatch):
    monkeypatch.setattr(grading, "PROGRESS_FLOOR", 0.3)
    trace(tmp_path, 0, {"e": "start"}, IN_A_COLLECTIVE)
    stall = grading.Stall(tmp_path, 1, seconds=60)
    stall()
    assert not stall.moving()  # what was there at the first look says nothing about progress
    trace(tmp_path, 0, {"e": "coll", "phase": "exit", "seq": 1, "op": "all_reduce"})
    stall()
    assert stall.moving()
    time.sleep(0.4)
    stall()
    assert not stall.moving()


def test_a_rank_whose_trace_stands_still_is_no_progress_however_busy_another_is(tmp_path, monkeypatch):
    """A real hang beside a busy rank: rank 0 waits in a collective for good while rank 1 loops and writes."""
    monkeypatch.setattr(grading, "PROGRESS_FLOOR", 0.3)
    trace(tmp_path, 0, {"e": "start"}, IN_A_COLLECTIVE)
    trace(tmp_path, 1, {"e": "start"})
    stall = grading.Stall(tmp_path, 2, seconds=60)
    stall()
    for _ in range(3):
        time.sleep(0.15)
        trace(tmp_path, 1, {"e": "loss", "v": 1.0})
        stall()
    assert not stall.moving()  # rank 0's trace never moved
    trace(tmp_path, 0, {"e": "coll", "phase": "exit", "seq": 1, "op": "all_reduce"})
    stall()
    assert stall.moving()  # both ranks moved within the window


SLOW = """
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
while True:  # correct and endless at this limit: every rank in the same collectives, in order
    dist.all_reduce(torch.ones(4))
    time.sleep(0.2)
"""


@pytest.mark.torchrun
def test_a_run_still_making_progress_at_its_limit_is_slow_not_a_hang(tmp_path):
    """A room grading at once on shared cores: correct code that ran out of time is said to be slow, with the
    longer limit as the fix, never the learner's hang."""
    learner = tmp_path / "slow.py"
    learner.write_text(SLOW)
    run = grading.observed(learner, 2, [], timeout_seconds=20)
    assert run.timed_out and run.still_moving and not run.hung, run.how_it_ended()
    assert "was still running when its 20 s limit stopped it" in run.how_it_ended()
    assert "slow, not hung" in run.how_it_ended()
    assert "waits" not in run.how_it_ended()  # no rank is blamed
    check = grading.ended(run)
    assert check.fix == grading.SLOW_HINT and "--timeout" in check.fix


def test_a_rooms_check_limit_is_the_default_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    from lab.course import records

    monkeypatch.delenv(records.CHECK_TIMEOUT_ENV, raising=False)
    assert records.check_timeout() == 120
    monkeypatch.setenv(records.CHECK_TIMEOUT_ENV, "300")
    assert records.check_timeout() == 300
    learner = tmp_path / "convert.py"
    learner.write_text("print('never run')\n")
    done = subprocess.run(
        [PYTHON, "-m", "lab", "exercise", "check", "convert", str(learner)],
        env={**os.environ, records.CHECK_TIMEOUT_ENV: "soon"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "lab: error: LAB_CHECK_TIMEOUT='soon': give seconds, 5 or more (or unset it for 120)"
    ], done.stderr


def _rank(rank: int, *opened: tuple[int, str], done: int = 0) -> grading.trace.Rank:
    """A rank's trace: `done` collectives entered and left, then `opened` entered and never left (seq, op)."""
    events: list[dict] = [{"e": "init", "backend": "gloo"}]
    for seq in range(1, done + 1):
        events += [
            {"e": "coll", "phase": phase, "seq": seq, "op": "all_reduce", "where": "f.py:3"}
            for phase in ("enter", "exit")
        ]
    events += [{"e": "coll", "phase": "enter", "seq": seq, "op": op, "where": "f.py:9"} for seq, op in opened]
    return grading.trace.Rank(rank, events)


def test_ranks_in_crossed_collectives_are_hung_however_recently_they_arrived():
    """fix-uneven's starter on a loaded machine: rank 1 reached its barrier and rank 0 DDP's all-reduce, both #5,
    moments before the limit. Neither can leave, so the run hung; a run whose ranks wait in the same collective, or
    whose one rank still computes, may only be slow."""
    assert grading.crossed([_rank(0, (5, "ddp_allreduce"), done=4), _rank(1, (5, "barrier"), done=4)])
    assert not grading.crossed([_rank(0, (5, "all_reduce"), done=4), _rank(1, (5, "all_reduce"), done=4)])
    assert not grading.crossed([_rank(0, (5, "ddp_allreduce"), done=4), _rank(1, done=4)])
