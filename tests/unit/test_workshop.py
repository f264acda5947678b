"""The workshop end to end on a tiny config: real runs, benchmarks, a comparison and a report."""

from __future__ import annotations

import json
import re

from PIL import Image

from tests.conftest import lab


def test_workshop_runs_everything_and_reports(tmp_path):
    proc = lab("workshop", "--config", "smoke", "--output-dir", str(tmp_path), "--set", "model.width=8",
               "--set", "train.log_every=4")
    [folder] = list(tmp_path.iterdir())
    result = json.loads((folder / "comparison.json").read_text())
    assert result["runs"]["baseline"]["world_size"] == 1 and result["runs"]["ddp-2"]["world_size"] == 2
    assert [r["step"] for r in result["loss_at_matching_steps"]] == [4, 8, 12, 16]
    # Same global batch, same data order: the first interval's loss agrees closely even with BatchNorm.
    assert result["loss_at_matching_steps"][0]["max_relative_difference"] < 0.05
    assert "synthetic" in result["data"]
    assert "| step | baseline loss | DDP x2 loss |" in proc.stdout
    assert (folder / "comparison.md").read_text().strip() in proc.stdout

    for name in ("allreduce", "scaling", "memory", "strategies"):
        assert json.loads((folder / f"{name}.json").read_text())["benchmark"] == name
    report = (folder / "report.md").read_text()
    assert f"report: {folder / 'report.md'}" in proc.stdout
    for section in ("## Training runs", "## All-reduce bus bandwidth", "## Scaling", "## Memory per device",
                    "## Strategies side by side"):
        assert section in report
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert set(images) == {"loss.png", "throughput.png", "allreduce.png", "scaling.png", "memory.png", "strategies.png"}
    for image in images:
        with Image.open(folder / image) as png:
            png.verify()  # a real PNG, not an empty file
