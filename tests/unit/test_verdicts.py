"""One vocabulary for every verdict the lab records (lab.verdict): each record kind written by the code that writes
it (the doctor's JSON by the real command, validate.json from canned facts, the device check's gpu-check.json by its
command over stand-in steps, accept's verdict, an exercise's and a lesson's records, the room's cells) and walked for
a verdict word outside held / failed / not run / not applicable. The walk can fail: a planted record is caught."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.course import records
from lab.machine.devicecheck import command as gpu_check
from lab.machine.health import acceptance
from lab.machine.health import validate as fabric
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, NOT_RUN, VERDICTS, Check, overall, passes
from tests.unit.test_fabric import _dgx_job
from tests.verdicts import outside

ROOT = Path(__file__).resolve().parents[2]


def test_the_walk_names_every_word_outside_the_vocabulary():
    planted = {
        "verdict": "passed",
        "steps": [{"step": "doctor", "status": "skipped"}, {"step": "x", "verdict": "held"}],
        "nodes": {"a": {"device_check": "PASS"}},
        "exercise": {"passed": True},
        "summary": {"status": "completed"},  # a run's state, not a verdict
        "facts": {"fabric": {"status": "Success"}},  # what nvidia-smi printed
    }
    assert outside(planted) == [
        "verdict: 'passed' is not one of held, failed, not run, not applicable",
        "steps[0].status: 'skipped': a verdict goes in a `verdict` field, in lab.verdict's words",
        "nodes.a.device_check: 'PASS' is not one of held, failed, not run, not applicable",
        "exercise.passed: the old flag 'passed'; a record says its `verdict`",
    ]


def test_the_vocabulary_refuses_a_word_outside_it_where_a_check_is_made():
    with pytest.raises(ValueError, match="'ok' is not a verdict; expected one of held, failed, not run"):
        Check("shm", "ok", "64 MiB")
    assert [passes(v) for v in VERDICTS] == [True, False, False, True]
    assert overall([HELD, NOT_APPLICABLE]) == HELD and overall([NOT_APPLICABLE]) == NOT_APPLICABLE


def test_the_doctors_json(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "doctor", "--output-dir", str(tmp_path), "--json", "-"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert doc["checks"] and outside(doc) == []
    assert doc["verdict"] == (HELD if proc.returncode == 0 else FAILED)


def test_validate_json_healthy_and_failing(tmp_path):
    healthy = fabric.verdict(_dgx_job(tmp_path / "a"), ["dgx01", "dgx02"], "v1")
    broken = fabric.verdict(_dgx_job(tmp_path / "b", **{"nodes.log": "starting\n"}), ["dgx01", "dgx02"], "v1")
    for doc in (healthy, broken):
        assert outside(doc) == []
        checks = [c for node in doc["nodes"].values() for c in node["checks"]]
        # the verdicts and the problems agree: a node passes exactly when each of its checks does
        assert doc["ok"] == all(passes(c["verdict"]) for c in checks), [c for c in checks if not passes(c["verdict"])]
    assert healthy["verdict"] == HELD and broken["verdict"] == FAILED


def test_the_device_checks_record_and_accepts_verdict(tmp_path, monkeypatch, capsys):
    steps = (
        gpu_check.Step("doctor", 1, 1, lambda h: gpu_check.Outcome("doctor", HELD, "7 checks")),
        gpu_check.Step("memory", 1, 1, lambda h: gpu_check.Outcome("memory", FAILED, "ratio 1.30")),
        gpu_check.Step("host syncs", 1, 1, lambda h: [], gpus=1, no_gpu="no CUDA device"),
        gpu_check.Step("Lightning peer", 1, 1, lambda h: [], needs=("lab_no_such_package",)),
    )
    args = argparse.Namespace(
        out=str(tmp_path / "check"), quick=True, allow_cpu=True, skip_without_gpu=False, json=None, deadline=None
    )
    args.epochs = 1
    monkeypatch.setattr(gpu_check, "STEPS", steps)
    assert gpu_check.run(args) == 1, capsys.readouterr().out
    doc = json.loads((tmp_path / "check" / "gpu-check.json").read_text())
    assert outside(doc) == [] and doc["verdict"] == FAILED
    assert [s["verdict"] for s in doc["steps"]] == [HELD, FAILED, NOT_APPLICABLE, NOT_RUN]
    run = tmp_path / "accept"
    run.mkdir()
    nodes = {"dgx01": {"platform": {"key": "h100-sxm-8"}}, "cpu1": {"platform": {"key": "cpu"}}}
    (run / "validate.json").write_text(json.dumps({"ok": True, "verdict": HELD, "problems": [], "nodes": nodes}))
    (run / "device-check").mkdir()
    (run / "device-check" / "dgx01.json").write_text(json.dumps({**doc, "gpu": True}))
    judged = acceptance.judge(run)
    assert outside(judged) == [] and judged["verdict"] == FAILED
    assert judged["nodes"]["cpu1"]["device_check"] == NOT_APPLICABLE


def test_an_exercises_and_a_lessons_records_and_the_rooms_cells(tmp_path, monkeypatch):
    monkeypatch.setenv(records.LESSON_RUNS_ENV, str(tmp_path))
    monkeypatch.delenv(records.PUSHGATEWAY_ENV, raising=False)
    graded = [
        Check("runs on 2 ranks", HELD, "2 ranks over gloo ended cleanly"),
        Check("disjoint shards", FAILED, "rank 0 and 1 share 96 of 96 samples", "a DistributedSampler"),
        Check("one writer", NOT_RUN, "not measured: the run crashed"),
    ]
    exercise = json.loads(records.write("convert", graded, 0.0).read_text())
    lesson = tmp_path / "01-demo"
    lesson.mkdir()
    records.begin(lesson, "01-demo")
    records.append(lesson, Check("the curves agree", HELD, ""))
    for record in (exercise, records.read(lesson)):
        assert outside(record) == [], record
    assert exercise["verdict"] == FAILED and records.cell(exercise) == "failed: disjoint shards"
    assert records.cell(records.read(lesson), 1) == "held 1/1" and records.cell(None) == NOT_RUN
