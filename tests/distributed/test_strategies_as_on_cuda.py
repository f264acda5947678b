"""FSDP and ZeRO-1/2/3 train with the optimizer a GPU run builds, and under train.amp=bf16 with BatchNorm, for
real under torchrun (2 ranks, gloo): one job trains every case two steps (tests/distributed/as_on_cuda_worker.py).

What broke on GPUs and is caught here on the CPU: CUDA's fused SGD on FSDP2's DTensor parameters (no sharding
rule for aten._fused_sgd_), FSDP's bf16 units casting BatchNorm's weights beside float32 running statistics
('expected scalar type BFloat16 but found Float'), bf16 logits reaching the loss, and DeepSpeed compiling its
shared-memory all-reduce (deepspeed_shm_comm) into TORCH_EXTENSIONS_DIR on every fresh machine.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from lab import compat
from tests.conftest import ROOT, torchrun

WORKER = str(ROOT / "tests" / "distributed" / "as_on_cuda_worker.py")
FSDP = ["fsdp", "fsdp-bf16"] if compat.fsdp_runs_on_cpu() else []  # torch 2.6: FSDP2 needs GPUs (lab.compat)
ZERO = ["zero1", "zero2", "zero3", "zero2-bf16", "zero3-bf16"] if importlib.util.find_spec("deepspeed") else []
CASES = FSDP + ZERO

pytestmark = pytest.mark.skipif(not CASES, reason="neither FSDP on CPU tensors (torch > 2.6) nor DeepSpeed here")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every case, two steps each, in one torchrun job; DeepSpeed's JIT builds would land in `extensions`."""
    out = tmp_path_factory.mktemp("as-on-cuda")
    extensions = out / "torch-extensions"
    extensions.mkdir()
    torchrun(2, WORKER, str(out), *CASES, env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    return out


def _record(out, case, rank=0):
    return json.loads((out / f"{case}-{rank}.json").read_text())


@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("bf16")])
def test_each_strategy_steps_with_the_optimizer_a_gpu_run_builds(trained, case):
    # FSDP's parameters are DTensors: foreach (DTensor shards each foreach op). ZeRO is handed the plain
    # parameters and steps its flat float32 partitions with the same optimizer: fused, as on a GPU.
    expected = {"fused": False, "foreach": True} if case == "fsdp" else {"fused": True, "foreach": False}
    for rank in (0, 1):
        record = _record(trained, case, rank)
        assert record["optimizer"] == expected
        assert len(record["losses"]) == 2 and all(math.isfinite(r["value"]) for r in record["losses"])


@pytest.mark.parametrize("case", [c for c in CASES if c.endswith("bf16")])
def test_bf16_with_batchnorm_trains_and_the_loss_is_computed_in_float32(trained, case):
    for rank in (0, 1):
        losses = _record(trained, case, rank)["losses"]
        assert len(losses) == 2 and all(math.isfinite(r["value"]) for r in losses)
        assert {(r["logits"], r["loss"]) for r in losses} == {("torch.float32", "torch.float32")}
        # BatchNorm kept float32 (its statistics would average in bf16 otherwise), as under autocast with DDP
        assert _record(trained, case, rank)["batchnorm_statistics"] == ["torch.float32"]


@pytest.mark.skipif(not ZERO, reason="DeepSpeed is not installed in this venv")
def test_deepspeed_builds_no_cpp_extension(trained):
    assert sorted(p.name for p in (trained / "torch-extensions").iterdir()) == []  # no deepspeed_shm_comm build
