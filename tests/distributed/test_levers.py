"""lab bench levers through the real command line: one torchrun job of two gloo ranks times the plain step and
each lever against it; accumulation is exact in float64; bad input is one line before torchrun starts. The NCCL
sweep needs GPUs: its command builder, its failure row and its table are checked here without one."""

from __future__ import annotations

import json
import sys

import pytest
from PIL import Image

from lab import plots
from lab.measure.bench.comm import nccl_sweep
from lab.measure.bench.train import levers
from tests.conftest import TINY, lab


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One short run shared by the tests that read its result (the job's start-up is most of its time)."""
    out = tmp_path_factory.mktemp("levers")
    proc = lab(
        "bench",
        "levers",
        *TINY,
        "--nproc-per-node",
        "2",
        "--steps",
        "1",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--equivalence-steps",
        "2",
        "--json",
        str(out / "levers.json"),
        "--plot",
        str(out / "levers.png"),
    )
    return proc.stdout, json.loads((out / "levers.json").read_text()), out / "levers.png"


def _timed_rows(result):
    g = result["groups"]
    return [result["plain"], *g["precision"], *g["accumulation"]["rows"], *g["buckets"]]


def test_every_lever_is_a_ratio_to_the_plain_step_of_the_same_run(measured):
    stdout, result, png = measured
    assert result["benchmark"] == "levers" and result["world_size"] == 2 and result["device"] == "cpu"
    g = result["groups"]
    assert set(g) == {"precision", "accumulation", "buckets", "nccl"}
    assert [r["label"] for r in g["precision"]] == ["bf16"]  # fp16 autocast is a GPU path
    assert [r["label"] for r in g["accumulation"]["rows"]] == ["accum-4"]
    assert [r["label"] for r in g["buckets"]] == ["bucket-1", "bucket-100", "no-bucket-view"]
    plain = result["plain"]
    assert plain["label"] == "plain" and plain["ratio_to_plain"] == 1.0
    for r in _timed_rows(result):
        assert r["ratio_to_plain"] > 0
        assert r["ratio_to_plain"] == pytest.approx(r["samples_per_second"] / plain["samples_per_second"])
        assert r["samples_per_second"] == pytest.approx(result["global_batch_size"] / r["step_seconds"])
        assert 0 <= r["communication_share"] < 1
        assert r["peak_memory_bytes"] is None and r["activation_bytes"] > 0  # no allocator statistics on a CPU
    # Activations are counted, not timed: accumulation keeps a quarter (micro-batches of B/4), bf16 about half.
    assert g["accumulation"]["rows"][0]["activation_bytes"] < 0.3 * plain["activation_bytes"]
    assert g["precision"][0]["activation_bytes"] < 0.6 * plain["activation_bytes"]
    assert g["precision"][0]["autocast"] == "bfloat16" and plain["autocast"] is None
    # Buckets change how gradients travel, not what they sum to: the same weights, batches and loss as plain.
    for r in g["buckets"]:
        assert r["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert g["nccl"]["applicable"] is False and "gloo" in g["nccl"]["reason"]
    assert "| accum-4 |" in stdout and "no peak statistics" in stdout and "NCCL settings: not measured" in stdout
    with Image.open(png) as image:
        image.verify()


def test_accumulated_micro_batches_equal_one_batch_in_float64(measured):
    stdout, result, _ = measured
    e = result["groups"]["accumulation"]["equivalence"]
    assert e["dtype"] == "float64" and e["norm"] == "group" and e["accum_steps"] == 4 and e["optimizer_steps"] == 2
    assert e["batch_size_per_rank"] == 32
    assert e["max_parameter_difference"] < 1e-10
    assert "the same up to rounding" in stdout


def test_accum_steps_that_do_not_divide_the_batch_per_rank_exit_2_before_torchrun():
    proc = lab("bench", "levers", *TINY, "--nproc-per-node", "2", "--accum-steps", "3", check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--accum-steps 3" in proc.stderr and "batch per rank, 32" in proc.stderr
    assert "lab.run.cluster.torchrun" not in proc.stdout  # torchrun, as the lab starts it, never started


# ----------------------------------------------------------------------------- no GPU needed


def test_nccl_children_set_one_variable_each_and_drop_the_users():
    user = {"NCCL_ALGO": "Tree", "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "PATH": "/bin"}
    seen = []
    for setting in nccl_sweep.NCCL_SETTINGS:
        argv, env = nccl_sweep.nccl_child(4, setting, "/tmp/r.json", user, torchrun="torchrun")
        assert argv[:4] == ["torchrun", "--standalone", "--nproc-per-node", "4"]
        assert argv[4:8] == ["-m", "lab", "bench", "allreduce"] and argv[-2:] == ["--json", "/tmp/r.json"]
        chosen = {k: v for k, v in env.items() if k in nccl_sweep.NCCL_VARIABLES}
        seen.append(chosen)
        assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/bin"  # only the swept variables are touched
    assert seen == [
        {},
        {"NCCL_ALGO": "Ring"},
        {"NCCL_ALGO": "Tree"},
        {"NCCL_PROTO": "Simple"},
        {"NCCL_PROTO": "LL128"},
        {"NCCL_P2P_DISABLE": "1"},
    ]


def test_a_failed_nccl_child_is_a_row_with_its_last_error_line(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('warming up', file=sys.stderr); sys.exit('NCCL error: boom')"]
    row = nccl_sweep.nccl_row("NCCL_ALGO=Tree", argv, {}, tmp_path / "never.json")
    assert row == {"label": "NCCL_ALGO=Tree", "error": "exit 1: NCCL error: boom"}


def test_nccl_does_not_apply_to_gloo_or_one_gpu():
    assert "gloo" in nccl_sweep.nccl_group(2, "cpu")["reason"]
    assert "one GPU" in nccl_sweep.nccl_group(1, "cuda")["reason"]


def _gpu_result():
    def row(label, group, sps, share):
        return {
            "label": label,
            "group": group,
            "what": label,
            "samples_per_second": sps,
            "step_seconds": 1 / sps,
            "peak_memory_bytes": 3 * 2**30,
            "step_memory_bytes": 2**30,
            "activation_bytes": 2**29,
            "communication_share": share,
            "loss": 2.3,
        }

    measured = {
        "rows": [
            row("plain", "plain", 1000.0, 0.2),
            row("bf16", "precision", 2000.0, 0.35),
            row("fp16", "precision", 1900.0, 0.3),
            row("accum-4", "accumulation", 900.0, 0.05),
            row("bucket-1", "buckets", 800.0, 0.4),
        ],
        "equivalence": {
            "max_parameter_difference": 2e-16,
            "dtype": "float64",
            "norm": "group",
            "accum_steps": 4,
            "batch_size_per_rank": 256,
            "optimizer_steps": 3,
        },
        "world_size": 8,
        "device": "NVIDIA H100",
        "device_type": "cuda",
        "threads": 1,
        "data": "synthetic",
        "global_batch_size": 2048,
        "batch_size_per_rank": 256,
    }
    sizes = [{"size": s, "oop_busbw": 100.0, "ip_busbw": 101.0} for s in (2**20, 2**24, 2**28)]
    nccl = {
        "applicable": True,
        "rows": [
            {"label": "default", "avg_busbw": 100.0, "busbw_by_size": sizes, "ratio_to_default": 1.0},
            {"label": "NCCL_P2P_DISABLE=1", "avg_busbw": 20.0, "busbw_by_size": sizes, "ratio_to_default": 0.2},
            {"label": "NCCL_ALGO=Tree", "error": "exit 1: NCCL error"},
        ],
    }
    args = type("Args", (), {"rounds": 3, "steps": 4, "warmup": 2, "accum_steps": 4})
    return levers.summarize(measured, nccl, args, width=64, threads=1)


def test_render_embeds_in_a_report_and_plot_draws_the_gpu_groups(tmp_path):
    result = _gpu_result()
    text = levers.render(result)
    lines = text.splitlines()
    assert not any(line.startswith("#") for line in lines)
    for i, line in enumerate(lines[:-1]):  # a table ends with a blank line before any text
        if line.startswith("|"):
            assert lines[i + 1].startswith("|") or lines[i + 1] == ""
    assert "| fp16 |" in text and "| NCCL_P2P_DISABLE=1 | 20.0 | 0.20x | 100.0 | 100.0 | 100.0 |" in text
    assert "| NCCL_ALGO=Tree | exit 1: NCCL error |" in text and "1024.0 MiB" in text
    assert result["groups"]["precision"][0]["ratio_to_plain"] == 2.0
    with Image.open(plots.levers(result, tmp_path / "levers.png")) as image:
        image.verify()
