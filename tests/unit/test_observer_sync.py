"""The exercises' observer adds no host sync to the learner's step loop: a CUDA loss is recorded by its place and
read with the others at the rank's end, not float()ed at every forward. No GPU here: the CUDA loss is a stand-in
with is_cuda set and no value to read (float() of it raises, as the sync it would be), and the test says so."""

from __future__ import annotations

import json

import pytest
import torch

from lab.course.exercises import recorder, trace


class DeviceLoss:
    """Stands in for a CUDA scalar: reading it on the host (float, item) is what the test forbids."""

    is_cuda = True

    def __init__(self, value: float) -> None:
        self.value = torch.tensor(value)

    def __float__(self) -> float:
        raise AssertionError("a host sync in the step loop: the observer read a CUDA loss at its forward")

    def float(self) -> torch.Tensor:  # what read_losses() stacks, once, at the end
        return self.value


def test_a_device_loss_is_read_at_the_end_not_at_each_forward(tmp_path, monkeypatch):
    rec = recorder.Recorder(str(tmp_path), 0, None)
    for value in (2.5, 2.25, 2.0):
        rec.loss(DeviceLoss(value))  # no float() here: it would raise
        rec.write("step")
    rec.loss(torch.tensor(1.5))  # a CPU loss is read at once (no device to wait for)
    assert len(rec.pending) == 3
    recorder.end(rec)
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert [e for e in events if e["e"] == "loss_values"][0]["v"] == [2.5, 2.25, 2.0]
    assert trace.Rank(0, events).losses == [2.5, 2.25, 2.0, 1.5]


def test_many_device_losses_are_read_in_batches_bounding_what_is_held(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder, "PENDING_LOSSES", 4)
    rec = recorder.Recorder(str(tmp_path), 0, None)
    for k in range(10):
        rec.loss(DeviceLoss(float(k)))
    assert len(rec.pending) == 2 and rec.losses_read == 8
    recorder.end(rec)
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert trace.Rank(0, events).losses == [float(k) for k in range(10)]


def test_the_stand_in_would_catch_a_read_at_the_forward():
    with pytest.raises(AssertionError, match="a host sync in the step loop"):
        float(DeviceLoss(1.0))  # what the observer did before: rec.write("loss", v=float(loss.detach()))


class DeviceTensor:
    """Stands in for a CUDA tensor (is_cuda), as NCCL's collectives take them: no GPU here."""

    is_cuda = True


class Enqueued:
    """An NCCL Work: returned at enqueue, completed when the device is done (as the test says)."""

    def __init__(self) -> None:
        self.completed = False

    def is_completed(self) -> bool:
        return self.completed


def test_a_device_collective_is_left_when_the_device_is_done_not_when_it_returns(tmp_path):
    """On NCCL a call returns at enqueue: a rank stuck in its all-reduce used to look as if it had left it, so the
    grader named no waiting rank (trace.waiting() None). Its exit now waits for the Work."""
    rec = recorder.Recorder(str(tmp_path), 0, None)
    works = [Enqueued(), Enqueued(), Enqueued()]
    for seq, work in enumerate(works, 1):
        rec.write("coll", phase="enter", seq=seq, op="all_reduce", where=f"t.py:{seq} in step")
        rec.left(seq, "all_reduce", [DeviceTensor()], work=work)
    works[0].completed = True  # #1 done on the device; #2 stuck (and #3 queued behind it)
    rec.settle()
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert trace.Rank(0, events).waiting() == {"seq": 2, "op": "all_reduce", "where": "t.py:2 in step"}
    works[1].completed = works[2].completed = True
    rec.settle()
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert trace.Rank(0, events).waiting() is None


def test_a_cpu_collective_is_left_when_it_returns(tmp_path):
    rec = recorder.Recorder(str(tmp_path), 0, None)
    rec.write("coll", phase="enter", seq=1, op="all_reduce", where="t.py:1 in step")
    rec.left(1, "all_reduce", [torch.ones(1)])
    events = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert trace.Rank(0, events).waiting() is None and not rec.unfinished
