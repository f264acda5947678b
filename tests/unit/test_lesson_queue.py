"""A lesson on a seat of one GPU slice in a room with a GPU queue (lab.course.teaching.lesson with
lab.run.cluster.gpu_queue): its plan is 2 ranks at GPU sizes, each command that runs on GPUs leases 2 of the queue's
for its run alone (waiting its turn), the others lease nothing, and lesson 7 stays off the queue. Real processes and
the kernel's real locks; the GPUs are names (no GPU here: the commands say what CUDA_VISIBLE_DEVICES they got).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lab.course.teaching import lesson
from lab.run.cluster import gpu_queue

SAYS_ITS_DEVICES = "import os; print('visible=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"
# another seat's command holding both GPUs for a while
HOLDS = """
import sys, time
from pathlib import Path
from lab.run.cluster import gpu_queue
with gpu_queue.lease(2, Path(sys.argv[1]), who="seat2"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def seat_of_one_slice(tmp_path, monkeypatch):
    folder = gpu_queue.prepare(tmp_path / "queue", ("6", "7"))
    monkeypatch.setenv(gpu_queue.QUEUE_ENV, str(folder))
    monkeypatch.setenv(lesson.FAKE_GPUS_ENV, "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-slice-of-seat1")
    monkeypatch.setenv(lesson.ROOT_ENV, str(tmp_path / "runs"))
    monkeypatch.setattr(lesson, "_off_the_queue", False)
    return folder


def test_the_plan_of_a_slice_in_a_room_with_a_queue_is_two_ranks_at_gpu_sizes(seat_of_one_slice):
    plan = lesson.plan()
    assert (plan.ranks, plan.gpu, plan.leased, plan.config, plan.env) == (2, True, 2, "workshop-gpu", {})
    assert "the room's GPU queue" in plan.why
    # lesson 7 stays off the queue, for every command its kernel runs from then on
    off = lesson.plan(queue=False)
    assert (off.ranks, off.gpu, off.leased, off.env) == (2, False, 0, {"CUDA_VISIBLE_DEVICES": ""})
    assert lesson.plan().leased == 0


def test_a_gpu_command_runs_on_two_leased_gpus_after_its_turn_and_others_lease_nothing(seat_of_one_slice, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLDS, str(seat_of_one_slice), "3"], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    started = time.monotonic()
    done = lesson.run(sys.executable, "-c", SAYS_ITS_DEVICES, gpus=True)
    waited = time.monotonic() - started
    holder.wait(timeout=30)
    out = capsys.readouterr().out
    assert "visible=6,7" in done.stdout  # the queue's GPUs, for this command alone
    assert "(waiting for 2 GPUs from the room's queue ...)" in out
    assert "(GPUs 6,7 from the room's queue after " in out
    assert waited >= 2, waited  # it waited its turn behind the other seat's run
    assert all(h is None for h in gpu_queue.holders(seat_of_one_slice).values())  # given back when it ended
    # a command that runs on no GPU (lab report, choose, the notebook's own) keeps the seat's own slice
    assert "visible=MIG-slice-of-seat1" in lesson.run(sys.executable, "-c", SAYS_ITS_DEVICES).stdout
    # and a cell that hides the GPUs from its command (lesson 4's CPU prediction) leases none and keeps them hidden
    hidden = lesson.run(sys.executable, "-c", SAYS_ITS_DEVICES, gpus=True, env={"CUDA_VISIBLE_DEVICES": ""})
    assert "visible=\n" in hidden.stdout
    # and which lab commands those are
    assert lesson.uses_gpus([sys.executable, "-m", "lab", "bench", "scaling", "--mode", "strong"])
    assert not lesson.uses_gpus([sys.executable, "-m", "lab", "exercise", "check", "convert"])  # leases its own
    assert not lesson.uses_gpus([sys.executable, "-m", "lab", "memory", "--params", "7e9"])


def test_without_a_queue_a_slices_lesson_runs_the_cpu_way_as_before(seat_of_one_slice, monkeypatch):
    monkeypatch.delenv(gpu_queue.QUEUE_ENV)
    plan = lesson.plan()
    assert (plan.ranks, plan.gpu, plan.leased, plan.env) == (2, False, 0, {"CUDA_VISIBLE_DEVICES": ""})
    assert "visible=" + "\n" in lesson.run(sys.executable, "-c", SAYS_ITS_DEVICES, gpus=True).stdout
