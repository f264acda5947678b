"""`lab bench lightning` through the real command line: `lab train` and Lightning's Trainer on two gloo ranks.

A toy size (width 8, 192 synthetic images, 4 steps): the test checks that both sides trained the same model on
the same data and that the JSON carries the ratio and its settings; the speed itself is BENCHMARKS.md's.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import PYTHON, lab, run

TOY = [
    "bench",
    "lightning",
    "--config",
    "smoke",
    "--set",
    "model.width=8",
    "--set",
    "train.global_batch_size=48",
    "--steps",
    "4",
]


def test_lab_and_lightning_train_the_same_model_on_two_ranks(tmp_path):
    proc = lab(*TOY, "--nproc-per-node", "2", "--json", str(tmp_path / "peer.json"))
    r = json.loads((tmp_path / "peer.json").read_text())
    for key in (
        "lab_images_per_second",
        "lightning_images_per_second",
        "ratio_lab_over_lightning",
        "steps",
        "warmup_steps",
        "global_batch_size",
        "nproc_per_node",
        "precision",
        "lightning_version",
    ):
        assert key in r, key
    assert r["lab_images_per_second"] > 0 and r["lightning_images_per_second"] > 0
    assert r["ratio_lab_over_lightning"] == pytest.approx(r["lab_images_per_second"] / r["lightning_images_per_second"])
    assert (r["steps"], r["warmup_steps"], r["timed_steps"]) == (4, 2, 2)
    assert (r["world_size"], r["batch_size_per_rank"], r["precision"]) == (2, 24, "32-true")
    assert r["lightning_strategy"] == "DDPStrategy" and r["lightning_version"] == "2.6.6"
    (lab_block,), (lightning_block,) = r["lab_blocks"], r["lightning_blocks"]
    for block in (lab_block, lightning_block):
        assert math.isfinite(block["warmup_loss"]) and math.isfinite(block["timed_loss"])
    # Same weights, shards, order, augmentation, optimizer and schedule: the two trainers' losses agree (the mean
    # over both ranks, per part of the run), which they would not if either side trained something else.
    assert lightning_block["warmup_loss"] == pytest.approx(lab_block["warmup_loss"], rel=1e-4)
    assert lightning_block["timed_loss"] == pytest.approx(lab_block["timed_loss"], rel=1e-4)
    assert "lab / Lightning images/s: " in proc.stdout


def test_without_lightning_one_line_names_the_package_and_exit_2():
    # Lightning hidden from this one interpreter: None in sys.modules makes find_spec and import see no package.
    code = f"import sys; sys.modules['lightning'] = None; from lab.cli import main; sys.exit(main({TOY!r}))"
    proc = run([PYTHON, "-c", code], check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "lab: error: lab bench lightning needs the Python package lightning, which is not installed: "
        "pip install lightning==2.6.6"
    ]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--warmup", "4"], "--warmup 4: leaves none of --steps 4 to time"),
        (["--set", "dist.strategy=fsdp"], "dist.strategy: fsdp is not compared with Lightning"),
        (["--nproc-per-node", "5"], "train.global_batch_size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra, says):
    proc = lab(*TOY, *extra, check=False)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
