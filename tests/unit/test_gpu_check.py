"""The device check's own decisions that a CPU can reach: a GPU torch cannot use, and the table."""

from __future__ import annotations

import json

from lab import nvml
from lab.bench import gpu_check


def test_a_gpu_that_torch_cannot_use_is_named_not_skipped(monkeypatch):
    # No GPU here: NVML's answer is faked (say so). A host with GPUs and a CPU-only torch (or a container started
    # without --gpus) must fail the check, not pass it as "no GPU found".
    monkeypatch.setattr(nvml, "device_count", lambda: 8)
    monkeypatch.setattr(nvml, "driver_version", lambda: "570.86.15")
    reason = gpu_check._gpu_torch_cannot_use()
    assert reason.startswith("the host has 8 NVIDIA GPU(s) (driver 570.86.15), but torch ")
    assert "cannot use them" in reason and "--gpus all" in reason


def test_no_gpu_at_all_is_a_dry_check(monkeypatch):
    monkeypatch.setattr(nvml, "host_has_gpus", lambda: False)
    assert gpu_check._gpu_torch_cannot_use() is None


def test_the_table_counts_what_ran():
    result = {"gpu": True, "device": "NVIDIA H200", "gpus": 1, "quick": False,
              "versions": {"driver": "570", "cuda": "12.8", "nccl": "2.26", "torch": "2.11.0"},
              "steps": [{"step": "doctor", "status": "passed", "detail": "7 checks"},
                        {"step": "all-reduce", "status": "skipped", "detail": "1 GPU"},
                        {"step": "memory", "status": "failed", "detail": "ratio 1.30"}]}
    lines = gpu_check.render(result).splitlines()
    assert lines[0] == "# lab gpu-check: NVIDIA H200 x 1; driver 570, CUDA 12.8, NCCL 2.26, torch 2.11.0"
    assert lines[1].split() == ["doctor", "passed", "7", "checks"]
    assert lines[-1] == "1 of 2 step(s) failed"


def test_the_levers_line_reads_a_gpu_result(tmp_path, monkeypatch):
    # No GPU here: the `lab bench levers` command is replaced by the 8-GPU result its own tests build (say so);
    # what is checked is the line gpu-check makes of it.
    from tests.distributed.test_levers import _gpu_result

    check = gpu_check.Check(out=tmp_path, quick=False, gpu=True, gpus=8)
    monkeypatch.setattr(gpu_check.Check, "lab", lambda self, log, *args: (tmp_path / "levers.json").write_text(
        json.dumps(_gpu_result())))
    outcome = gpu_check.levers(check)
    assert outcome.status == "passed"
    assert "images/s vs fp32: bf16 2.00x, fp16 1.90x" in outcome.detail
    assert "(float64) 2.0e-16" in outcome.detail and "NCCL_P2P_DISABLE=1 0.20x" in outcome.detail
