"""The run directory after a crash: torn writes are dropped at the next start, and the work a restart
redoes is counted from what the previous start logged."""

from __future__ import annotations

import json

from lab.run.training.runs import RunDir, read_metrics, write_json


def _row(step: int, time: float, attempt: int = 0) -> str:
    return json.dumps({"kind": "train", "step": step, "time": time, "attempt": attempt}) + "\n"


def test_a_new_start_drops_torn_rows_and_temp_files(tmp_path):
    run = RunDir(tmp_path, "r").create()
    run.metrics.write_text(_row(1, 10.0) + _row(2, 11.0) + '{"kind": "train", "st')  # killed mid-row
    for leftover in (run.checkpoints / "last.pt.tmp-123", run.path / "summary.json.tmp-9", run.path / ".write-test-9"):
        leftover.write_text("partial")
    (run.checkpoints / "last.pt").write_text("the real one")

    RunDir(tmp_path, "r").create()
    assert run.metrics.read_text() == _row(1, 10.0) + _row(2, 11.0)
    assert sorted(p.name for p in run.path.rglob("*") if p.is_file()) == ["last.pt", "metrics.jsonl"]


def test_steps_redone_count_what_the_last_start_logged_past_the_resume_step(tmp_path):
    run = RunDir(tmp_path, "r").create()
    assert run.progress() == (0, 0)  # a new run
    # start 0 at t=100 logged steps 1..8 and died; start 1 at t=200 resumed from 5, logged 6..7, died;
    write_json(
        run.manifest,
        {"starts": [{"time": 100.0, "step": 0, "steps_redone": 0}, {"time": 200.0, "step": 5, "steps_redone": 3}]},
    )
    run.metrics.write_text(
        "".join(_row(s, 100.0 + s) for s in range(1, 9)) + "".join(_row(s, 200.0 + s, attempt=1) for s in (6, 7))
    )
    furthest, redone_before = run.progress()
    assert (furthest, redone_before) == (7, 3)  # a restart from 5 now loses 2 more, not 3 again
    assert [(r["step"], r["attempt"]) for r in read_metrics(run.path)][-4:] == [(4, 0), (5, 0), (6, 1), (7, 1)]


def test_a_start_that_logged_nothing_loses_nothing(tmp_path):
    run = RunDir(tmp_path, "r").create()
    write_json(run.manifest, {"starts": [{"time": 100.0, "step": 0}, {"time": 200.0, "step": 5, "steps_redone": 3}]})
    run.metrics.write_text("".join(_row(s, 100.0 + s) for s in range(1, 9)))  # start 1 died before its first row
    assert run.progress() == (5, 3)
