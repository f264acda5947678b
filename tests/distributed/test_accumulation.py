"""DDP with gradient accumulation, under torchrun, for every shipped config.

Two ranks x 2 micro-batches of 8 must follow one process at the full batch of 32, step by
step, to within float64 rounding: accumulation is one of the course's three optimisation
levers, and it goes through DDP's `no_sync`, which a config's DDP settings can break (with
`dist.static_graph: true` the reducer asserts on the first backward inside `no_sync`,
PyTorch issue 143580; the `ddp` and `workshop-gpu` configs once shipped with it).
Each config keeps its own DDP settings; the overrides only make the run small and exact
(float64, GroupNorm, so a sample's output does not depend on its batch-mates).
"""

from __future__ import annotations

import json
import sys

from lab.run import config
from tests.conftest import run, torchrun
from tests.distributed.test_equivalence import WORKER

SMALL_EXACT = [
    "model.norm=group",
    "model.width=8",
    "model.dtype=float64",
    "model.compile=false",
    "model.sync_batchnorm=false",
    "data.source=synthetic",
    "data.synthetic_train_size=128",
    "data.synthetic_test_size=16",
    "train.global_batch_size=32",
    "train.epochs=1",
    "train.max_steps=3",
    "train.log_every=1",
    "run.deterministic=true",
    "checkpoint.save=false",
]


def _losses(path):
    return [r["loss"] for r in json.loads(path.read_text()) if r["kind"] == "train"]


def test_accumulation_under_ddp_matches_one_process_at_the_full_batch_for_every_shipped_config(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    run(
        [sys.executable, WORKER, "shipped", str(one), *SMALL_EXACT, "train.grad_accum_steps=1"],
        env={"OMP_NUM_THREADS": "1"},
    )
    torchrun(2, WORKER, "shipped", str(two), *SMALL_EXACT, "train.grad_accum_steps=2")

    names = config.shipped_names()
    assert {"ddp", "workshop-gpu"} <= set(names)
    for name in names:
        single, ddp = _losses(one / f"rows-{name}-0.json"), _losses(two / f"rows-{name}-0.json")
        assert len(single) == len(ddp) == 3, name
        for step, (a, b) in enumerate(zip(single, ddp), start=1):
            assert abs(a - b) <= 1e-9 * abs(a), f"{name}, step {step}: {a!r} (1 process) vs {b!r} (2 ranks x 2)"
        assert _losses(two / f"rows-{name}-1.json") == ddp, f"{name}: the ranks logged different losses"
