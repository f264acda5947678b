"""The report's Markdown as a real renderer reads it: tables end where they should, one title."""

from __future__ import annotations

import json

from lab import report
from lab.bench import scaling
from tests.conftest import lab
from tests.markdown import problems


def test_the_checker_sees_both_mistakes():
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert problems(f"# Report\n\n{table}a note right under the table\n")[0].startswith("line 6 is read as a table row")
    assert problems(f"# Report\n\n{table}\n# 7e+09 parameters\n")[0].startswith("2 top-level headings")
    assert problems(f"# Report\n\n{table}\na note after a blank line\n") == []


def _scaling_result(mode: str) -> dict:
    measured = [{"world_size": n, "global_batch_size": 64 * n, "samples_per_second": 100.0 * n / (1 + 0.1 * (n - 1)),
                 "step_seconds": 0.1, "no_sync_step_seconds": 0.08 if n > 1 else None, "compute_step_seconds": 0.06,
                 "communication_share": 0.2 if n > 1 else None, "device": "cpu"} for n in (1, 2, 4)]
    rows = scaling.derive(measured)
    fitted = scaling.fit(rows, mode)
    return {"benchmark": "scaling", "mode": mode, "rows": rows, "context": "synthetic, cpu", "note": "a note.",
            fitted["law"]: fitted}


def test_a_report_of_every_benchmark_renders_as_meant(tmp_path):
    lab("memory", "--params", "7e9", "--world-size", "8", "--device", "h100", "--json", str(tmp_path / "memory.json"))
    for mode in ("strong", "weak"):
        (tmp_path / f"scaling-{mode}.json").write_text(json.dumps(_scaling_result(mode)))
    rows = [{"size": 2 ** k, "oop_busbw": 1.0 + k, "ip_busbw": 1.5 + k} for k in range(3, 8)]
    (tmp_path / "allreduce.json").write_text(json.dumps({
        "benchmark": "allreduce", "world_size": 2, "backend": "gloo", "dtype": "float32", "op": "sum",
        "devices": ["cpu", "cpu"], "rows": rows, "avg_busbw": 3.0}))
    text = report.build([str(tmp_path)]).read_text()
    assert problems(text) == []
    for heading in ("## All-reduce bus bandwidth", "## Strong scaling", "## Weak scaling", "## Memory per device"):
        assert heading in text
    assert "Amdahl's law fitted" in text and "Gustafson's law fitted" in text
    for image in ("scaling-strong.png", "scaling-weak.png", "step-time-strong.png", "memory.png"):
        assert (tmp_path / image).stat().st_size > 0 and f"]({image})" in text
