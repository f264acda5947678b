"""`lab predict` for real: 1 and 2 gloo ranks measured, 3 predicted and then measured, every number where the
table and the JSON say it is (the cheap run docs/prediction.md shows)."""

from __future__ import annotations

import json
import shlex

from tests.conftest import lab

COMMAND = ".venv/bin/lab predict --config smoke --check-up-to 3 --steps 2 --warmup 1"


def test_predict_measures_two_predicts_the_third_and_measures_it(tmp_path):
    out = tmp_path / "predict.json"
    proc = lab(*shlex.split(COMMAND)[1:], "--json", str(out))
    result = json.loads(out.read_text())
    rows = {r["world_size"]: r for r in result["rows"]}
    assert sorted(rows) == [1, 2, 3] and [rows[n]["input"] for n in (1, 2, 3)] == [True, True, False]
    for r in rows.values():
        assert r["predicted_step_seconds"] > 0 and r["measured_step_seconds"] > 0
        assert (
            abs(r["predicted_step_seconds"] - r["measured_step_seconds"]) / r["measured_step_seconds"] == (r["error"])
        )
    sources = {a["name"]: a["source"] for a in result["assumptions"]}
    assert sources["bus bandwidth"].startswith("measured here, 2 ranks")
    assert sources["backward share of compute"].startswith("assumed")
    assert "| 3 |" in proc.stdout and "Assumptions:" in proc.stdout
    assert {p["world_size"] for p in result["projection"]["rows"]} == {8, 64, 512}
