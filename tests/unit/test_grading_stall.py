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
