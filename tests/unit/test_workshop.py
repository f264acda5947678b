"""The workshop end to end on a tiny config: two real runs and a comparison saved beside them."""

from __future__ import annotations

import json

from tests.conftest import lab


def test_workshop_runs_baseline_and_ddp_and_compares(tmp_path):
    proc = lab("workshop", "--config", "smoke", "--output-dir", str(tmp_path), "--set", "model.width=8",
               "--set", "train.log_every=4")
    [folder] = list(tmp_path.iterdir())
    result = json.loads((folder / "comparison.json").read_text())
    assert (folder / "baseline" / "summary.json").exists() and (folder / "ddp-2" / "summary.json").exists()
    assert result["runs"]["baseline"]["world_size"] == 1 and result["runs"]["ddp"]["world_size"] == 2
    assert [r["step"] for r in result["loss_at_matching_steps"]] == [4, 8, 12, 16]
    # Same global batch, same data order: the first interval's loss agrees closely even with BatchNorm.
    assert result["loss_at_matching_steps"][0]["relative_difference"] < 0.05
    assert result["throughput_ratio_ddp_over_baseline"] > 0
    assert "synthetic" in result["data"]
    assert "| step | baseline loss | DDP x2 loss |" in proc.stdout and "images/s" in proc.stdout
    assert (folder / "comparison.md").read_text().strip() in proc.stdout
