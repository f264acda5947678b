"""The room's GPU queue (lab.run.cluster.gpu_queue) with real processes and the kernel's real locks; the GPUs are
names (no GPU here: a lease hands out CUDA_VISIBLE_DEVICES entries, and the test says so).

- a class's checks at once: every one gets its GPUs, no GPU is held by two at once, none is starved, and the
  waits follow the plan's prediction (lab.course.room.plan.queue_waits);
- a lease ends with its process, killed or not: no GPU stays taken;
- a multi-rank exercise run leases its GPUs from the queue, runs with them as its CUDA_VISIBLE_DEVICES, and its
  limit counts from its start on them (the queue's wait is never the learner's hang);
- `lab room plan --queue-gpus` keeps whole GPUs out of the seats, and the room's status shows who holds them.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.course.exercises import grading, on_queue
from lab.course.room import plan as room_plan
from lab.course.room import plan_table
from lab.course.room.host import GIB, Host
from lab.course.room.status import queue_text
from lab.errors import LabError
from lab.run.cluster import gpu_queue
from tests.together import run_together

# A seat's check as a process: wait in the queue for 2 GPUs, hold them HOLD seconds, say what it had and when.
# A class checking at once: tests.together.run_together.
CHECK = """
import json, os, sys, time
from pathlib import Path
from lab.run.cluster import gpu_queue
asked = time.time()
with gpu_queue.lease(2, Path(sys.argv[1]), who=sys.argv[2]) as leased:
    got = time.time()
    time.sleep(float(sys.argv[3]))
    print(json.dumps({"seat": sys.argv[2], "gpus": list(leased.devices), "asked": asked, "got": got,
                      "waited": leased.waited_seconds, "gave_back": time.time()}))
"""


def _checks(folder: Path, seats: int, hold: float) -> list[dict]:
    return run_together(
        CHECK, [[str(folder), f"seat{i + 1}", str(hold)] for i in range(seats)], folder.parent / "ready"
    )


def test_a_class_checking_at_once_is_served_in_turn_as_the_plan_predicts(tmp_path):
    folder = gpu_queue.prepare(tmp_path / "queue", ("4", "5", "6", "7"))
    seats, hold = 24, 1.0
    done = _checks(folder, seats, hold)
    assert sorted(d["seat"] for d in done) == sorted(f"seat{i + 1}" for i in range(seats))  # none starved
    for gpu in ("4", "5", "6", "7"):  # no GPU in two checks at once
        spans = sorted((d["got"], d["gave_back"]) for d in done if gpu in d["gpus"])
        assert all(end <= start + 0.01 for (_, end), (start, _) in zip(spans, spans[1:])), (gpu, spans)
    assert all(len(set(d["gpus"])) == 2 for d in done)
    longest, mean = plan_table.queue_waits(seats, 4, hold)
    measured = max(d["waited"] for d in done)
    print(
        f"\n{seats} checks of {hold:g} s on 4 GPUs: longest wait {measured:.1f} s (plan {longest:.1f}), mean "
        f"{sum(d['waited'] for d in done) / seats:.1f} s (plan {mean:.1f})"
    )
    # the queue really serves them in turn (no faster than the plan) and adds little to it (a loaded CI machine
    # starts 24 interpreters at once: the slack is theirs)
    assert longest - 0.5 <= measured <= 2 * longest + 10


def test_a_lease_ends_with_its_process_killed_or_not(tmp_path):
    folder = gpu_queue.prepare(tmp_path / "queue", ("0", "1"))
    holder = subprocess.Popen([sys.executable, "-c", CHECK, str(folder), "seat1", "600"], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not any(gpu_queue.holders(folder).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    held = gpu_queue.holders(folder)
    assert {d: (h or {}).get("who") for d, h in held.items()} == {"0": "seat1", "1": "seat1"}
    assert "the GPU queue: 2 of 2 GPUs leased" in queue_text(held) and "GPU 1: seat1 (pid" in queue_text(held)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert gpu_queue.holders(folder) == {"0": None, "1": None}
    with gpu_queue.lease(2, folder) as leased:  # and at once, not after a timeout
        assert leased is not None and leased.devices == ("0", "1") and leased.waited_seconds < 5


def test_no_queue_or_too_small_a_queue_runs_without_one_and_a_wrong_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_queue.QUEUE_ENV, raising=False)
    with gpu_queue.lease(2) as leased:
        assert leased is None
    folder = gpu_queue.prepare(tmp_path / "queue", ("0", "1"))
    with gpu_queue.lease(3, folder) as leased:
        assert leased is None  # three ranks cannot have a GPU each from two: the caller runs on the CPU and says so
    with pytest.raises(LabError, match=r"LAB_GPU_QUEUE=.*nowhere: no GPU queue there"):
        with gpu_queue.lease(2, tmp_path / "nowhere"):
            pass
    assert gpu_queue.devices(gpu_queue.prepare(folder, ("2", "3"))) == ("2", "3")  # planned again: the old go


# A learner's multi-rank script that says which devices each rank was given, then makes a process group of gloo
# (no GPU here: the check says the leased GPUs went unused).
SAYS_ITS_DEVICES = """
import os, sys
from pathlib import Path
import torch.distributed as dist
Path(sys.argv[1], "rank-" + os.environ["RANK"]).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.torchrun
def test_a_multi_rank_check_runs_on_leased_gpus_and_its_limit_counts_from_their_start(tmp_path, monkeypatch, capfd):
    folder = gpu_queue.prepare(tmp_path / "queue", ("6", "7"))
    monkeypatch.setenv(gpu_queue.QUEUE_ENV, str(folder))
    monkeypatch.setattr(grading.cores, "gpu_count", lambda: 1)  # a seat of one MIG slice (no GPU here: said)
    script = tmp_path / "learner.py"
    script.write_text(SAYS_ITS_DEVICES)
    seen = tmp_path / "seen"
    seen.mkdir()
    # another seat's check holds both GPUs for longer than this run's limit
    other = subprocess.Popen([sys.executable, "-c", CHECK, str(folder), "seat2", "40"], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not all(gpu_queue.holders(folder).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    run = grading.observed(script, 2, [str(seen)], timeout_seconds=30)
    other.wait(timeout=60)
    err = capfd.readouterr().err
    assert run.ok, run.output[-2000:]
    assert {p.name: p.read_text() for p in seen.iterdir()} == {"rank-0": "6,7", "rank-1": "6,7"}
    waited = float(err.split("from the room's queue after ")[1].split(" s")[0])
    assert waited > 30, err  # it waited out the other's 40 s, longer than its own 30 s limit, and was not stopped
    assert "(the limit counts from here)" in err
    assert "note: 2 ranks ran over gloo, not on the leased GPUs 6,7 (torch saw no GPU there)" in err
    # a seat with GPUs of its own enough for its ranks takes nothing from the queue
    monkeypatch.setattr(grading.cores, "gpu_count", lambda: 2)
    with on_queue.gpus_for(2) as leased:
        assert leased is None


def test_the_plan_keeps_whole_gpus_for_the_queue_and_says_the_wait():
    host = Host(room_plan.planned_slices(6, 3) + ("6", "7"), tuple(range(224)), 2000 * GIB)
    room = room_plan.make_plan(host, seats=16, queue_gpus=2)
    assert room.queue == ("6", "7")
    assert not {d for s in room.seats for d in s.devices} & set(room.queue)
    table = plan_table.table(room)
    assert "| on 2 GPUs leased from the queue (6,7) |" in table
    assert "16 seats checking at once: the last waits ~375 s (mean 188 s)" in table
    assert "--seats 16 --queue-gpus 2   # the plan with those UUIDs" in table
    saved = room_plan.RoomPlan(host, room.seats, room.notes, room.queue, 30.0)
    assert room_plan.check(saved, "plan.json").queue == ("6", "7")
    with pytest.raises(LabError, match="--queue-gpus 3: this host has 2 whole GPU"):
        room_plan.make_plan(host, seats=16, queue_gpus=3)
    with pytest.raises(LabError, match="GPU 7 is in the queue and in seat a"):
        room_plan.check(room_plan.RoomPlan(host, (room_plan.Seat("a", ("7",)),), queue=("6", "7")), "plan.json")
    # a CPU host and a room without a queue are as before
    cpu = room_plan.make_plan(Host((), (0, 1), 24 * GIB), seats=2)
    assert cpu.queue == () and "the CPU way (2 gloo processes): no queue" in plan_table.table(cpu)


def test_serve_makes_the_queue_beside_the_room_for_local_seats_and_gives_them_its_folder(tmp_path, capsys):
    from lab.course.room import seats, serve
    from lab.course.room.settings import RoomSettings

    host = Host(("0", "1", "2", "3"), (0, 1), 24 * GIB)
    room = room_plan.make_plan(host, seats=2, gpus_per_seat=1, queue_gpus=2)
    state = tmp_path / "room"
    closed = [
        p for p in (tmp_path, *tmp_path.parents) if p.stat().st_mode & 0o001 == 0
    ]  # pytest's own folders are 0700
    if closed:
        with pytest.raises(LabError, match=f"{closed[-1]} lets others no search"):
            serve._queue_folder(room, RoomSettings(spawner="local"), state)
        assert not (tmp_path / "room-gpu-queue").exists()  # refused before anything is made
    modes = {p: p.stat().st_mode for p in closed}
    try:
        for p in closed:
            p.chmod(p.stat().st_mode | 0o001)
        where = serve._queue_folder(room, RoomSettings(spawner="local"), state)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert where == tmp_path / "room-gpu-queue"
    folder = str(gpu_queue.prepare(where, room.queue))
    assert gpu_queue.devices(Path(folder)) == ("2", "3")
    modes = {p.name: p.stat().st_mode & 0o777 for p in Path(folder).iterdir()}
    assert modes == {"queue.lock": 0o666, "gpu-2.lock": 0o666, "gpu-3.lock": 0o666}  # any seat locks them
    assert Path(folder).stat().st_mode & 0o777 == 0o755  # none adds or removes a GPU
    env = seats.environment(room.seats[0], tmp_path / "home", gpu_queue=folder)
    assert env[gpu_queue.QUEUE_ENV] == folder and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["LAB_CHECK_TIMEOUT"] == "300"  # a class grading at once shares the cores: its checks get longer
    assert gpu_queue.QUEUE_ENV not in seats.environment(room.seats[0], tmp_path / "home")
    # a container's or a Slurm job's seat cannot reach this host's locks: said, and no folder given
    assert serve._queue_folder(room, RoomSettings(spawner="docker"), state) is None
    assert "serves local seats only" in capsys.readouterr().out


def test_room_status_watch_redraws_who_holds_the_queue_until_ctrl_c(tmp_path):
    from lab.course.room.settings import RoomSettings

    state = tmp_path / "room"
    room = room_plan.make_plan(Host(("0", "1", "2", "3"), (0, 1), 24 * GIB), seats=2, gpus_per_seat=1, queue_gpus=2)
    room_plan.save(room, state / "plan.json")
    folder = gpu_queue.prepare(tmp_path / "room-gpu-queue", room.queue)
    RoomSettings(gpu_queue=str(folder)).save(state)
    watch = subprocess.Popen(
        [sys.executable, "-m", "lab", "room", "status", "--room-dir", str(state), "--watch", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert watch.stdout is not None
    seen: list[str] = []
    with gpu_queue.lease(2, folder, who="seat2"):
        for line in watch.stdout:  # the first draws show the queue free, a later one the lease taken here
            seen.append(line)
            if line.startswith("  GPU 3: seat2"):  # the last line of a draw with the lease in it
                break
    watch.send_signal(signal.SIGINT)
    rest, _ = watch.communicate(timeout=60)
    output = "".join(seen) + rest
    assert watch.returncode == 0, output
    assert "the GPU queue: 2 of 2 GPUs leased\n  GPU 2: seat2 (pid" in output
    assert output.rstrip().endswith("lab room status: stopped watching") and "Traceback" not in output
