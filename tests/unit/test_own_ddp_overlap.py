"""own-ddp's overlap, read from traces written as NCCL writes them: a CUDA collective's exit comes when the device is
done (lab.course.exercises.recorder.Recorder.left), long after the host call returned, so an exit says nothing of
where the learner waited. The overlap is read from the learner's wait instead (the host's order of calls is the
compute stream's). No GPU here: the traces are built by hand, each the shape the observer writes on CUDA."""

from __future__ import annotations

from typing import Any

from lab.course.exercises.own_ddp import traced
from lab.course.exercises.trace import Rank


def step_events(order: list[str]) -> list[dict[str, Any]]:
    """A stage of one step from a script: "g" a gradient marked, "l1" all-reduce 1 launched (async), "w1" its
    handle waited, "x1" its exit (the device done), "s1" a synchronous all-reduce 1, "b" backward returned."""
    events: list[dict[str, Any]] = [
        {"e": "probe", "what": "stage", "stage": 1},
        {"e": "probe", "what": "step", "phase": "begin"},
    ]
    for token in order:
        kind, seq = token[0], int(token[1:] or 0)
        if kind == "g":
            events.append({"e": "probe", "what": "grad", "name": "p"})
        elif kind == "b":
            events.append({"e": "probe", "what": "step", "phase": "backward"})
        elif kind in "ls":
            events.append({"e": "coll", "phase": "enter", "seq": seq, "op": "all_reduce", "shapes": [[4]]})
            events[-1].update({"async": True} if kind == "l" else {})
        elif kind == "w":
            events.append({"e": "coll", "phase": "wait", "seq": seq, "op": "all_reduce"})
        elif kind == "x":
            events.append({"e": "coll", "phase": "exit", "seq": seq, "op": "all_reduce"})
    events.append({"e": "probe", "what": "step", "phase": "finished"})
    return events


def only_step(order: list[str]) -> traced.Step:
    return traced.stages(Rank(0, step_events(order)))[1].steps[0]


def test_a_wait_in_the_hook_is_no_overlap_though_the_device_finished_later():
    # On NCCL: launched, waited at once in the hook (the compute stream now waits for it), the next gradients
    # marked, and the device's exits written only afterwards. The exits fall after later gradients; the waits do not.
    found = only_step(["g", "l1", "w1", "g", "l2", "w2", "b", "x1", "x2"])
    assert found.in_flight == 0 and found.never_waited == 0


def test_a_wait_in_finish_overlaps_every_all_reduce_but_the_last():
    found = only_step(["g", "l1", "g", "l2", "b", "w1", "w2", "x1", "x2"])
    assert found.in_flight == 1 and found.after_backward == 0


def test_a_synchronous_all_reduce_is_waited_for_where_it_is_called():
    found = only_step(["g", "s1", "x1", "g", "s2", "b", "x2"])
    assert found.in_flight == 0


def test_launches_after_backward_and_handles_never_waited_are_told_apart():
    after = only_step(["g", "g", "b", "l1", "w1", "l2", "w2"])
    assert after.after_backward == 2 and after.in_flight == 0
    unwaited = only_step(["g", "l1", "g", "b"])
    assert unwaited.never_waited == 1
