"""The roll call: counts the nodes at a real c10d store, and never outlives the launcher that started it.

The second test guards the launcher from its observer. The observer used to be a thread of the launcher
blocked in a TCPStore connect: c10d's retry warnings (20 lines of C++ frames each) landed in the launch log,
which this test catches every time, and a launcher exiting while the connect returned died of SIGABRT
("terminate called without an active exception") instead of returning torchrun's status and the
rendezvous' one-line reason (once in CI, in the ansible test of a node that cannot reach its head; a race
no test here reproduces on demand). The observer is now a child process, stopped at any moment."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest

from lab.course.teaching.lesson import free_ports
from lab.run.cluster.rollcall import RollCall


@pytest.mark.slow  # two observer processes polling a real store: about 7 s
def test_two_launchers_count_each_other_at_the_store():
    from torch.distributed import TCPStore

    port = free_ports()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    calls = [RollCall("127.0.0.1", port, "r1", 30, expected=2).start() for _ in range(2)]
    deadline = time.monotonic() + 60  # a hang guard: each sees 2 within a poll or two
    while any(c.arrived != 2 for c in calls) and time.monotonic() < deadline:
        time.sleep(0.2)
    for call in calls:
        call.stop()
    assert [c.arrived for c in calls] == [2, 2]
    assert store.add("lab/roll_call/r1", 0) == 2  # each added itself once


def test_a_launcher_exits_cleanly_while_its_roll_call_is_still_connecting():
    # Nothing listens at the port: the observer's connect retries, warns after its 2 s timeout and gives up
    # a few seconds later; the launcher stops it in the middle of that.
    script = (
        "import time; from lab.run.cluster.rollcall import RollCall; "
        f"call = RollCall('127.0.0.1', {free_ports()}, 'r1', 2, expected=2).start(); "
        "time.sleep(4); call.stop(); print('arrived', call.arrived)"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "arrived None\n", "")
