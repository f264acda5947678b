"""Hangs planted in real torchrun jobs (gloo, 2 and 4 ranks, lab/course/pitfalls/planted_hang.py): a rank that skips
one all-reduce, one that calls another collective, one that sleeps past the timeout, one killed by SIGKILL. Each
run ends within the timeout's reach with the diagnosis naming the rank, the collective (number and operation) and
the line, in the terminal and in hang.json; `lab hang` reads it again; nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.run.cluster import hang

SCRIPT = Path(__file__).parents[2] / "lab" / "course" / "pitfalls" / "planted_hang.py"
TIMEOUT = 8.0  # dist.timeout_seconds of the planted runs
HANG = 2.0  # dist.hang_seconds: the watchdog speaks this long into the stall
GUARD = 180  # a hang must fail the test, not CI. Not a speed check.


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in text)


def planted(tmp_path: Path, plant: str, nproc: int, rank: int) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab",
            "launch",
            "--nproc-per-node",
            str(nproc),
            "--",
            "-m",
            "lab.course.pitfalls.planted_hang",
        ]
        + ["--plant", plant, "--rank", str(rank), "--timeout", str(TIMEOUT), "--hang", str(HANG)],
        env={**os.environ, "OMP_NUM_THREADS": "1", hang.FOLDER_ENV: str(tmp_path), "LAB_PLANT_MARK": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    return done, time.monotonic() - started


def left_running(mark: str) -> list[int]:
    """Processes still alive whose environment carries this test's mark."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if f"LAB_PLANT_MARK={mark}".encode() in (entry / "environ").read_bytes():
                    alive.append(int(entry.name))
            except OSError:
                continue
    return alive


def ranks_by_state(diagnosis: dict) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for r in diagnosis["ranks"]:
        found.setdefault(r["state"], []).append(r["rank"])
    return found


CASES = {
    # plant, ranks, the planted rank, the states expected, what the planted rank shows
    "skip": ("skip", 2, 1, {"waiting": [0], "mismatch": [1]}, "barrier"),
    "other": ("other", 4, 2, {"waiting": [0, 1, 3], "mismatch": [2]}, "all_gather"),
    "sleep": ("sleep", 2, 1, {"waiting": [0], "elsewhere": [1]}, "PLANTED: sleep"),
    "kill": ("kill", 4, 3, {"waiting": [0, 1, 2], "dead": [3]}, "SIGKILL"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_planted_hang_is_named_with_its_rank_collective_and_line(case, tmp_path):
    plant, nproc, rank, states, shown = CASES[case]
    done, seconds = planted(tmp_path, plant, nproc, rank)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    diagnosis = json.loads((tmp_path / "hang.json").read_text())
    # skip: gloo pairs rank 1's next all-reduce with rank 0's (same op, same size) and one side may complete before
    # rank 1's exit barrier meets rank 0's next one: on loaded cores rank 0 was seen still in the first (CI,
    # 2026-12-06). Undefined behaviour of a mismatch either way; both name rank 1 as the odd one.
    also = [{"waiting": [0], "ahead": [1]}] if case == "skip" else []
    assert ranks_by_state(diagnosis) in [states, *also], diagnosis["summary"]
    waiting = [r for r in diagnosis["ranks"] if r["state"] == "waiting"]
    assert {(r["op"], r["seq"]) for r in waiting} == {("all_reduce", diagnosis["collective"]["seq"])}
    assert {r["where"]["line"] for r in waiting} == {line_of("THE ALL-REDUCE")}
    assert all(r["where"]["file"].endswith("planted_hang.py") for r in waiting)
    odd = next(r for r in diagnosis["ranks"] if r["rank"] == rank)
    if odd["state"] == "ahead":
        assert odd["last_seq"] > diagnosis["collective"]["seq"]
    elif odd["state"] == "mismatch":
        assert odd["op"] == shown and odd["seq"] == diagnosis["collective"]["seq"]
    elif odd["state"] == "elsewhere":
        assert odd["where"]["line"] == line_of(shown)
    else:
        assert shown in odd["exit"]
    assert diagnosis["summary"] in output  # said in the terminal, in the same words
    assert seconds < TIMEOUT + 60, f"{seconds:.0f} s"  # the collective's timeout ended it, not the guard
    assert left_running(str(tmp_path)) == []

    shown_again = subprocess.run(
        [sys.executable, "-m", "lab", "hang", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert shown_again.returncode == 0 and diagnosis["summary"] in shown_again.stdout


def test_the_watchdog_speaks_while_the_collective_still_waits(tmp_path):
    """The block comes from a rank's watchdog at dist.hang_seconds, before dist.timeout_seconds ends the run."""
    done, _ = planted(tmp_path, "other", 2, 1)
    output = done.stdout + done.stderr
    said = output.index(f"lab: no progress for {HANG:g} s")
    assert said < output.index("Timed out waiting"), output[-3000:]
    assert json.loads((tmp_path / "hang.json").read_text())["seen_by"].startswith("rank ")


def test_a_run_that_ends_well_leaves_no_diagnosis(tmp_path):
    done, _ = planted(tmp_path, "none", 2, 1)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert not (tmp_path / "hang.json").exists() and not list(tmp_path.glob("hang/rank-*.json"))


def test_lab_hang_refuses_a_missing_folder_and_says_when_there_is_nothing(tmp_path):
    missing = subprocess.run(
        [sys.executable, "-m", "lab", "hang", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "no such directory" in missing.stderr and "Traceback" not in missing.stderr
    empty = subprocess.run([sys.executable, "-m", "lab", "hang", str(tmp_path)], capture_output=True, text=True)
    assert empty.returncode == 1 and "no rank left a record" in empty.stdout


def test_the_record_cost_benchmark_measures_both_sides_in_one_run(tmp_path):
    """`lab bench hang-record`, shortened: torchrun jobs with the record on and off, the ratios from both."""
    out = tmp_path / "cost.json"
    done = subprocess.run(
        [sys.executable, "-m", "lab", "bench", "hang-record", "--config", "smoke", "--nproc-per-node", "2"]
        + ["--rounds", "1", "--steps", "3", "--calls", "50", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(out.read_text())
    assert result["record"] in ("flight recorder", "lab record")
    assert len(result["step_seconds_on"]) == len(result["step_seconds_off"]) == 1
    assert result["step_ratio_on_over_off"] > 0 and result["allreduce_ratio_on_over_off"] > 0
    assert "time on / off: a training step" in done.stdout
