"""Two ranks with half the batch follow the single-device run, step by step.

GroupNorm (not BatchNorm) makes a sample's output independent of which rank's
batch it is in, and the sharded order plus per-sample augmentation make the
global batches identical; what is left is floating-point reduction order, which
float64 pushes below 1e-9 (float32 would drift to 1e-3 within 10 steps, so a
float32 loss-curve match would not be a sound test).
"""

from __future__ import annotations

import json
import sys

import torch

from tests.conftest import ROOT, run, torchrun

WORKER = str(ROOT / "tests" / "distributed" / "worker.py")
EXACT = [
    "model.norm=group",
    "model.width=8",
    "train.global_batch_size=32",
    "train.max_steps=10",
    "train.log_every=1",
    "data.synthetic_train_size=256",
    "run.deterministic=true",
    "checkpoint.save=false",
]


def _losses(path):
    return [r["loss"] for r in json.loads(path.read_text()) if r["kind"] == "train"]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_float64_loss_curves_match_and_ranks_end_identical(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    overrides = [*EXACT, "model.dtype=float64"]
    run([sys.executable, WORKER, "fit", str(one), *overrides], env={"OMP_NUM_THREADS": "1"})
    torchrun(2, WORKER, "fit", str(two), *overrides)

    single, ddp = _losses(one / "rows0.json"), _losses(two / "rows0.json")
    assert len(single) == len(ddp) == 10
    for step, (a, b) in enumerate(zip(single, ddp), start=1):
        assert abs(a - b) <= 1e-9 * abs(a), f"step {step}: {a!r} vs {b!r}"
    assert single[-1] < single[0]  # it trained, so the agreement means something

    rank0, rank1 = torch.load(two / "final0.pt"), torch.load(two / "final1.pt")
    for name, value in rank0["params"].items():
        assert torch.equal(value, rank1["params"][name]), name
    base = torch.load(one / "final0.pt")["params"]
    flat = lambda sd: torch.cat([v.flatten() for v in sd.values()])  # noqa: E731
    assert _relative(flat(rank0["params"]), flat(base)) < 1e-9


def test_float32_first_step_averaged_gradients_match(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    run([sys.executable, WORKER, "grads", str(one), *EXACT], env={"OMP_NUM_THREADS": "1"})
    torchrun(2, WORKER, "grads", str(two), *EXACT)
    single = torch.load(one / "grads0.pt")
    rank0, rank1 = torch.load(two / "grads0.pt"), torch.load(two / "grads1.pt")
    for name, grad in single.items():
        assert torch.equal(rank0[name], rank1[name]), f"{name}: ranks hold different averaged gradients"
        assert _relative(rank0[name], grad) < 1e-5, name


def test_a_one_rank_process_group_trains_exactly_like_no_group(tmp_path):
    # dist.single_process_group: the device check's way through a process group, DDP and (on GPUs) NCCL
    # with one GPU. Here gloo at world size 1, outside torchrun (an in-process store): the same numbers.
    plain, grouped = tmp_path / "plain", tmp_path / "grouped"
    plain.mkdir(), grouped.mkdir()
    overrides = [*EXACT, "train.max_steps=4", "train.grad_accum_steps=2"]
    run([sys.executable, WORKER, "fit", str(plain), *overrides], env={"OMP_NUM_THREADS": "1"})
    run(
        [sys.executable, WORKER, "fit", str(grouped), *overrides, "dist.single_process_group=true"],
        env={"OMP_NUM_THREADS": "1"},
    )
    a, b = torch.load(plain / "final0.pt"), torch.load(grouped / "final0.pt")
    assert (a["backend"], a["wrapped_in_ddp"]) == (None, False)
    assert (b["backend"], b["wrapped_in_ddp"]) == ("gloo", True)
    assert _losses(plain / "rows0.json") == _losses(grouped / "rows0.json")
    for name, value in a["params"].items():
        assert torch.equal(value, b["params"][name]), name
