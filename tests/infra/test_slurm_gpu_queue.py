"""The room's GPU queue through Slurm's GRES (lab.run.cluster.slurm_gpus) on the real test cluster's partition
`gpu`: two nodes of two GPUs each, fake devices Slurm hands out as it would real ones (tests/infra/slurm_cluster.py;
no GPU is behind them, so the runs train on nothing: they say which devices Slurm gave them).

- a class's checks at once: each gets 2 GPUs of one node as Slurm's CUDA_VISIBLE_DEVICES, none starved, no GPU in
  two checks at once, and the waits beside the plan's prediction (lab.course.room.plan_table.queue_waits);
  LAB_QUEUE_SEATS=24 measures a whole class (the suite runs 6);
- a multi-rank exercise run waits in Slurm's queue longer than its own limit and is graded from its start on its
  GPUs, not called a hang; its ranks are a step of the allocation, and no allocation is left behind;
- a partition Slurm does not have is one line; a check that asks more GPUs than a node has runs on the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.course.exercises import grading
from lab.course.room import plan_table
from lab.errors import LabError
from lab.run.cluster import gpu_queue, slurm_gpus
from tests.infra.slurm_cluster import GPU_NODES, GPUS_PER_NODE, SlurmCluster
from tests.together import run_together

QUEUE = "slurm:gpu"

# A seat's check as a process: wait in Slurm's queue for 2 GPUs, run a step on them that says what Slurm gave it
# and holds them HOLD seconds, say when. A class checking at once: tests.together.run_together.
CHECK = """
import json, os, subprocess, sys, time
from pathlib import Path
from lab.run.cluster import gpu_queue
asked = time.time()
with gpu_queue.lease(2, sys.argv[1], who=sys.argv[2], hold_seconds=120) as leased:
    got = time.time()
    step = [*leased.launcher, sys.executable, "-c",
            "import os, time; print(os.environ['SLURMD_NODENAME'], os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'), "
            "flush=True); time.sleep(float(os.environ['HOLD']))"]
    said = subprocess.run(step, env={**os.environ, "HOLD": sys.argv[3]}, capture_output=True, text=True, check=True)
    node, visible = said.stdout.split()
    print(json.dumps({"seat": sys.argv[2], "gpus": list(leased.devices), "visible": visible, "node": node,
                      "source": leased.source, "asked": asked, "got": got, "waited": leased.waited_seconds,
                      "gave_back": time.time()}))
"""

SAYS_ITS_DEVICES = """
import os, sys
from pathlib import Path
Path(sys.argv[1], "rank-" + os.environ["RANK"]).write_text(
    os.environ.get("CUDA_VISIBLE_DEVICES", "unset") + " " + os.environ.get("SLURM_JOB_ID", "no job"))
"""


@pytest.fixture
def seat_env(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    return cluster.env


def _checks(tmp_path: Path, env: dict[str, str], seats: int, hold: float) -> list[dict]:
    return run_together(CHECK, [[QUEUE, f"seat{i + 1}", str(hold)] for i in range(seats)], tmp_path / "ready", env)


def _pairs(spans: list[tuple[float, float]]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    return list(zip(spans, spans[1:]))


def _lab_checks(env: dict[str, str]) -> list[dict[str, str]]:
    return slurm_gpus.holders("gpu")


def _none_left(env: dict[str, str]) -> bool:
    """No check's job in Slurm's queue, once those cancelled this moment have finished completing (state CG)."""
    deadline = time.monotonic() + 60
    while _lab_checks(env) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not _lab_checks(env)


def test_a_class_checking_at_once_gets_slurms_gpus_in_turn_beside_the_plans_wait(tmp_path, seat_env):
    seats, hold = int(os.environ.get("LAB_QUEUE_SEATS", "6")), 1.0
    done = _checks(tmp_path, seat_env, seats, hold)
    assert sorted(d["seat"] for d in done) == sorted(f"seat{i + 1}" for i in range(seats))  # none starved
    for d in done:  # 2 GPUs of one node, as Slurm set the step's CUDA_VISIBLE_DEVICES and scontrol shows them
        assert d["node"] in GPU_NODES and len(d["gpus"]) == 2, d
        assert d["visible"] == ",".join(d["gpus"]), d
        assert d["source"].startswith("Slurm (job "), d
    for node in GPU_NODES:
        for gpu in map(str, range(GPUS_PER_NODE)):  # no GPU in two checks at once
            spans = sorted((d["got"], d["gave_back"]) for d in done if d["node"] == node and gpu in d["gpus"])
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), (node, gpu, spans)
    # Slurm's turnaround: from one check's end on a GPU to the next one's start there (a cancel, the job's end, the
    # next allocation); the plan's wait is for a check's whole turn, its time on the GPUs and this
    gaps = [
        after[0] - before[1]
        for node in GPU_NODES
        for gpu in map(str, range(GPUS_PER_NODE))
        for before, after in _pairs(
            sorted((d["got"], d["gave_back"]) for d in done if d["node"] == node and gpu in d["gpus"])
        )
    ]
    held = sum(d["gave_back"] - d["got"] for d in done) / seats
    turnaround = sum(gaps) / len(gaps)
    gpus = len(GPU_NODES) * GPUS_PER_NODE
    bare, _ = plan_table.queue_waits(seats, gpus, held)
    predicted, predicted_mean = plan_table.queue_waits(seats, gpus, held + turnaround)
    longest = max(d["waited"] for d in done)
    mean = sum(d["waited"] for d in done) / seats
    print(
        f"{seats} checks at once through Slurm ({gpus} GPUs, 2 a check, {held:.2f} s each on its GPUs, Slurm's "
        f"turnaround {turnaround:.2f} s): longest wait {longest:.1f} s (plan {predicted:.1f} s; {bare:.1f} s without "
        f"the turnaround), mean {mean:.1f} s (plan {predicted_mean:.1f} s)"
    )
    assert 0.75 * predicted <= longest <= 1.25 * predicted + 2.0, (longest, predicted)
    assert _none_left(seat_env)  # every allocation ended with its check


@pytest.mark.torchrun
def test_a_check_that_waits_in_slurms_queue_past_its_limit_is_graded_from_its_start(
    tmp_path, seat_env, monkeypatch, capfd
):
    monkeypatch.setenv(gpu_queue.QUEUE_ENV, QUEUE)
    script = tmp_path / "learner.py"
    script.write_text(SAYS_ITS_DEVICES)
    seen = tmp_path / "seen"
    seen.mkdir()
    # two other seats' checks hold all four GPUs for longer than this run's limit
    others = [
        subprocess.Popen(
            [sys.executable, "-c", CHECK, QUEUE, f"other{i}", "40"], stdout=subprocess.PIPE, env=seat_env, text=True
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 60
    while sum(j["state"] == "RUNNING" for j in _lab_checks(seat_env)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    run = grading.observed(script, 2, [str(seen)], timeout_seconds=30)
    for other in others:
        other.wait(timeout=120)
    err = capfd.readouterr().err
    assert run.ok, run.output[-2000:]
    said = {p.name: p.read_text().split() for p in seen.iterdir()}
    assert sorted(said) == ["rank-0", "rank-1"]
    (visible, job), (visible_1, job_1) = said["rank-0"], said["rank-1"]
    assert (visible, job) == (visible_1, job_1) and len(visible.split(",")) == 2  # one step, Slurm's 2 GPUs
    assert f"from Slurm (job {job} on " in err, err
    waited = float(err.split(", partition gpu) after ")[1].split(" s")[0])
    assert waited > 30, err  # it waited out the others' 40 s, longer than its own 30 s limit, and was not stopped
    assert "(the limit counts from here)" in err
    assert _none_left(seat_env)  # its allocation ended with it


def test_a_partition_slurm_lacks_is_one_line_and_too_many_ranks_run_on_the_cpu(seat_env):
    with pytest.raises(LabError, match=r"^LAB_GPU_QUEUE=slurm:nope: Slurm has no partition 'nope'"):
        with gpu_queue.lease(2, "slurm:nope"):
            pass
    with gpu_queue.lease(GPUS_PER_NODE + 1, QUEUE) as leased:  # more than one node has: the caller says so
        assert leased is None
    assert slurm_gpus.partition("gpu") == slurm_gpus.Partition("gpu", GPUS_PER_NODE, None)  # MaxTime=INFINITE


def test_a_room_served_with_a_partition_slurm_lacks_stops_in_one_line_before_making_anything(tmp_path, seat_env):
    done = subprocess.run(
        [sys.executable, "-m", "lab", "room", "serve", "--queue-partition", "nope", "--room-dir", str(tmp_path / "r")],
        env=seat_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "lab: error: --queue-partition nope: Slurm has no partition 'nope' (sinfo lists no node in it); give one whose "
        "nodes have GPUs (sinfo -o '%P %G')"
    ]
    assert not (tmp_path / "r").exists()
