"""Anyone's script under `lab launch` (tests/distributed/foreign/plain_hang.py: plain torch, no import of the lab),
with one rank's hang planted: a rank asleep before the all-reduce, a rank that skips one, a rank that makes an extra
one (gloo aborts it), a rank killed by SIGKILL, on 2 and 4 ranks. Each is named with the ranks, the collectives and
the lines, in the terminal and in hang.json, within 60 s; `lab hang` reads it again; nothing is left running; Ctrl-C
on a stalled run says the same and prints no torchrun traceback."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.run.cluster import hang
from tests.distributed.test_hang import left_running

SCRIPT = Path(__file__).parent / "foreign" / "plain_hang.py"
NAME = "plain_hang.py"
GUARD = 180  # a hang must fail the test, not CI. Not a speed check.


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in text)


# docs/reliability.md shows these two, run here as typed (from tests/distributed/foreign)
SLEEP_AS_DOCUMENTED = (
    "python -m lab launch --nproc-per-node 2 --hang-seconds 5 --stop-seconds 2 -- plain_hang.py --plant sleep --rank 1"
)
MISMATCH_AS_DOCUMENTED = "python -m lab launch --nproc-per-node 2 --hang-seconds 5 --stop-seconds 2 -- plain_hang.py --plant mismatch --rank 0"  # noqa: E501
DOCUMENTED = {("sleep", 2, 1): SLEEP_AS_DOCUMENTED, ("mismatch", 2, 0): MISMATCH_AS_DOCUMENTED}


def command(nproc: int, plant: str, rank: int, stop_seconds: int = 2) -> list[str]:
    if stop_seconds == 2 and (plant, nproc, rank) in DOCUMENTED:
        return [sys.executable, *shlex.split(DOCUMENTED[plant, nproc, rank])[1:]]
    return [
        *(sys.executable, "-m", "lab", "launch", "--nproc-per-node", str(nproc)),
        *("--hang-seconds", "5", "--stop-seconds", str(stop_seconds)),
        *("--", NAME, "--plant", plant, "--rank", str(rank)),
    ]


def environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", hang.FOLDER_ENV: str(tmp_path), "LAB_PLANT_MARK": str(tmp_path)}


ALL_REDUCE = f"all_reduce #{{}} at {NAME}:{line_of('# every rank')} in main"
ASLEEP = f"never came (at {NAME}:{line_of('never comes')} in load)"
EXTRA = f"in all_reduce at {NAME}:{line_of('the others do not')} in main"
CASES = {
    # plant, ranks, the planted rank, what the summary must say
    "sleep-2": ("sleep", 2, 1, [ALL_REDUCE.format(1), f"rank 1 {ASLEEP}"]),
    "sleep-4": ("sleep", 4, 3, [ALL_REDUCE.format(1), f"rank 3 {ASLEEP}"]),
    "skip-2": ("skip", 2, 1, [ALL_REDUCE.format(3), "rank 1 is in barrier #3 where the others are in all_reduce #3"]),
    "mismatch-2": ("mismatch", 2, 0, ["rank 0 died (Signal 6 (SIGABRT)", EXTRA, ALL_REDUCE.format(2)]),
    "kill-4": ("kill", 4, 2, ["rank 2 died (Signal 9 (SIGKILL)", ALL_REDUCE.format(1)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_plain_scripts_hang_is_named_with_its_ranks_collectives_and_lines(case, tmp_path):
    plant, nproc, rank, said = CASES[case]
    started = time.monotonic()
    done = subprocess.run(
        command(nproc, plant, rank),
        cwd=SCRIPT.parent,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=GUARD,
    )
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    diagnosis = json.loads((tmp_path / "hang.json").read_text())
    for words in said:
        assert words in diagnosis["summary"], diagnosis["summary"]
    assert f"the run ended in the hang named above ({tmp_path / 'hang.json'})" in output or (
        f"the run failed in a collective ({tmp_path / 'hang.json'})" in output
    ), output[-3000:]
    assert diagnosis["summary"] in output
    assert seconds < 60, f"{seconds:.0f} s"  # the watchdog's stall decided, not gloo's 30 minutes
    assert left_running(str(tmp_path)) == []
    again = subprocess.run([sys.executable, "-m", "lab", "hang", str(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 0 and diagnosis["summary"] in again.stdout


def test_ctrl_c_on_a_stalled_script_says_the_hang_and_no_traceback_of_torchrun(tmp_path):
    proc = subprocess.Popen(
        command(2, "sleep", 1, stop_seconds=0),  # never ended by the lab: only Ctrl-C ends it
        cwd=SCRIPT.parent,
        env=environment(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    assert proc.stdout is not None
    deadline = time.monotonic() + GUARD
    for line in proc.stdout:  # the watchdog's block first, while the all-reduce waits
        seen.append(line)
        if line.startswith("lab: no progress for 5 s") or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=GUARD)
    output = "".join(seen) + rest
    assert proc.returncode == 130, output[-3000:]
    assert f"lab launch: the run ended in the hang named above ({tmp_path / 'hang.json'})" in output, output[-3000:]
    assert f"rank 1 {ASLEEP}" in output
    assert "SignalException" not in output
    assert left_running(str(tmp_path)) == []


def test_a_plain_script_that_ends_well_is_watched_and_leaves_no_diagnosis(tmp_path):
    done = subprocess.run(
        command(2, "none", 1), cwd=SCRIPT.parent, env=environment(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "rank 0: 8.0" in done.stdout and "rank 1: 8.0" in done.stdout  # 1 -> 2 -> 4 -> 8 over three all-reduces
    assert not (tmp_path / "hang.json").exists() and not list(tmp_path.glob("hang/rank-*.json"))


def test_the_dry_run_shows_the_watch_and_its_absence():
    wrapped = subprocess.run(
        [sys.executable, "-m", "lab", "launch", "--nproc-per-node", "2", "--dry-run", "--", NAME],
        capture_output=True,
        text=True,
    )
    assert "-m lab.run.cluster.watched --hang-seconds 30 --stop-seconds 300 -- plain_hang.py" in wrapped.stdout
    plain = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab",
            "launch",
            "--nproc-per-node",
            "2",
            "--hang-seconds",
            "0",
            "--dry-run",
            "--",
            NAME,
        ],
        capture_output=True,
        text=True,
    )
    assert plain.stdout.strip().endswith("--standalone --nproc-per-node 2 plain_hang.py"), plain.stdout
