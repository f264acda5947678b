"""The report's Markdown as a real renderer reads it: tables end where they should, one title."""

from __future__ import annotations

import json
from typing import Any

from lab.course.teaching import report
from lab.measure.bench.train import scaling
from tests.conftest import lab
from tests.markdown import problems


def test_the_checker_sees_both_mistakes():
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert problems(f"# Report\n\n{table}a note right under the table\n")[0].startswith("line 6 is read as a table row")
    assert problems(f"# Report\n\n{table}\n# 7e+09 parameters\n")[0].startswith("2 top-level headings")
    assert problems(f"# Report\n\n{table}\na note after a blank line\n") == []


def _scaling_result(mode: str) -> dict[str, Any]:
    measured = [
        {
            "world_size": n,
            "global_batch_size": 64 * n,
            "samples_per_second": 100.0 * n / (1 + 0.1 * (n - 1)),
            "step_seconds": 0.1,
            "no_sync_step_seconds": 0.08 if n > 1 else None,
            "compute_step_seconds": 0.06,
            "communication_share": 0.2 if n > 1 else None,
            "device": "cpu",
        }
        for n in (1, 2, 4)
    ]
    rows = scaling.derive(measured)
    fitted = scaling.fit(rows, mode)
    assert fitted is not None  # three points: a law is fitted
    return {
        "benchmark": "scaling",
        "mode": mode,
        "rows": rows,
        "context": "synthetic, cpu",
        "note": "a note.",
        fitted["law"]: fitted,
    }


def test_a_report_of_every_benchmark_renders_as_meant(tmp_path):
    lab("memory", "--params", "7e9", "--world-size", "8", "--device", "h100", "--json", str(tmp_path / "memory.json"))
    for mode in ("strong", "weak"):
        (tmp_path / f"scaling-{mode}.json").write_text(json.dumps(_scaling_result(mode)))
    rows = [{"size": 2**k, "oop_busbw": 1.0 + k, "ip_busbw": 1.5 + k} for k in range(3, 8)]
    (tmp_path / "allreduce.json").write_text(
        json.dumps(
            {
                "benchmark": "allreduce",
                "world_size": 2,
                "backend": "gloo",
                "dtype": "float32",
                "op": "sum",
                "devices": ["cpu", "cpu"],
                "rows": rows,
                "avg_busbw": 3.0,
            }
        )
    )
    for name, ip_wrong in (("sendrecv", None), ("all_gather", 0)):  # lab bench collective: one file per op
        (tmp_path / f"c-{name}.json").write_text(
            json.dumps(
                {
                    "benchmark": "collective",
                    "collective": name,
                    "world_size": 2,
                    "backend": "gloo",
                    "dtype": "float32",
                    "op": "none",
                    "devices": ["cpu", "cpu"],
                    "avg_busbw": 3.0,
                    "rows": [{**r, "oop_wrong": 0, "ip_wrong": ip_wrong} for r in rows],
                }
            )
        )
    text = report.build([str(tmp_path)]).read_text()
    assert problems(text) == []
    for heading in (
        "## All-reduce bus bandwidth",
        "## Collectives: bus bandwidth by operation",
        "## Strong scaling",
        "## Weak scaling",
        "## Memory per device",
    ):
        assert heading in text
    assert text.index("| all_gather | (n-1) / n | 2 |") < text.index("| sendrecv | 1 | 2 |")  # in the table's order
    assert "Amdahl's law fitted" in text and "Gustafson's law fitted" in text
    for image in ("collectives.png", "scaling-strong.png", "scaling-weak.png", "step-time-strong.png", "memory.png"):
        assert (tmp_path / image).stat().st_size > 0 and f"]({image})" in text


def test_the_playbooks_validate_json_is_a_section_of_its_own(tmp_path):
    """validate.json as the validate role writes it (the shape the three-node test in tests/infra produces)."""
    check = {"avg_busbw": 0.3, "floor": 1e9, "hosts": ["a", "b"], "ok": False, "world_size": 2, "wrong": 0}
    health = {"dcgm_diag": "not present", "xid_events": "not present", "ecc_uncorrected": "not present"}
    doc = {
        "check": "validate",
        "run_id": "v",
        "ok": False,
        "problems": ["b: all-reduce of GPU pair 0,1: busbw 9 GB/s"],
        "definitions": {"busbw": "nccl-tests' busbw", "floor": "the highest floor"},
        "nodes": {
            "a": {
                "gpus": 2,
                "floors": {},
                "health": health,
                "pairs": [{"pair": "0,1", "avg_busbw": 300.0, "floor": 200.0, "ok": True}],
            },
            "b": {
                "gpus": 2,
                "floors": {},
                "health": {**health, "xid_events": 0},
                "pairs": [{"pair": "0,1", "avg_busbw": None, "floor": 200.0, "ok": False}],
            },
        },
        "all_nodes": check,
        "ring": {"a+b": check},
        "suspects": [],
    }
    (tmp_path / "validate.json").write_text(json.dumps(doc))
    text = report.build([str(tmp_path / "validate.json")], str(tmp_path)).read_text()
    assert "## Fabric validation" in text and "Verdict: failed." in text
    assert "| GPU pair 0,1 | b | 2 | did not run | 200 | failed: below |" in text
    assert "| all nodes | a, b | 2 | 0.3 | 1e+09 | failed: below |" in text and "| ring pair | a, b |" in text
    assert "- b: all-reduce of GPU pair 0,1: busbw 9 GB/s" in text
    assert problems(text) == []


def _predict_result() -> dict[str, Any]:
    """`lab predict --json`'s shape, by hand: 1 and 2 ranks measured, 3 and 4 predicted, then measured."""
    measured = {1: 0.100, 2: 0.110, 3: 0.125, 4: 0.140}
    predicted = {1: 0.100, 2: 0.110, 3: 0.120, 4: 0.126}
    rows = [
        {
            "world_size": n,
            "input": n <= 2,
            "predicted_step_seconds": predicted[n],
            "measured_step_seconds": measured[n],
            "predicted_samples_per_second": 32 * n / predicted[n],
            "measured_samples_per_second": 32 * n / measured[n],
            "predicted_exposed_communication_seconds": 0.002,
            "error": abs(predicted[n] - measured[n]) / measured[n],
        }
        for n in measured
    ]
    assumptions = [
        {"name": "bus bandwidth", "value": 0.125, "unit": "GB/s", "source": "measured here, 2 ranks"},
        {"name": "backward share of compute", "value": 2 / 3, "unit": "", "source": "assumed: backward ~ 2x forward"},
    ]
    projection = [
        {
            "world_size": 8,
            "nodes": 1,
            "strategy": "ddp",
            "step_seconds": 0.1,
            "exposed_communication_seconds": 1e-5,
            "efficiency": 0.999,
        }
    ]
    return {
        "benchmark": "predict",
        "context": "synthetic CIFAR-shaped data, cpu, batch 32 a rank",
        "measure_up_to": 2,
        "rows": rows,
        "measured": [],
        "assumptions": assumptions,
        "projection": {"platform": "h100-sxm-8", "rows": projection},
    }


def test_a_prediction_is_a_table_of_predicted_against_measured_its_assumptions_and_a_plot(tmp_path):
    (tmp_path / "predict.json").write_text(json.dumps(_predict_result()))
    text = report.build([str(tmp_path)]).read_text()
    assert problems(text) == []
    assert "## Scaling predicted, then measured" in text
    assert "measured on 1 and 2 ranks" in text and "not fed the answer: 10.0% at 4 ranks." in text
    # one row per world size, the inputs marked, the error where the model predicted
    assert "| 1 | 100.0 | 100.0 | 0.0% (input) | 320.0 | 320.0 |" in text
    assert "| 3 | 120.0 | 125.0 | 4.0% | 800.0 | 768.0 |" in text
    assert "| 4 | 126.0 | 140.0 | 10.0% | 1015.9 | 914.3 |" in text
    # every assumption with its value, unit and source
    assert "| bus bandwidth | 0.125 GB/s | measured here, 2 ranks |" in text
    assert "| backward share of compute | 0.6667 | assumed: backward ~ 2x forward |" in text
    assert "| 8 | 1 | ddp | 100.0 | 0.01 | 99.9% |" in text and "on h100-sxm-8's links" in text
    assert (tmp_path / "predict.png").stat().st_size > 0 and "](predict.png)" in text
