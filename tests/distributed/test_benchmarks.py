"""Benchmarks through the real command line: all-reduce over real gloo ranks, scaling, memory, report."""

from __future__ import annotations

import json
import re

import pytest
from PIL import Image

from tests.conftest import lab

SMALL = ["bench", "allreduce", "-b", "8", "-e", "64K", "-f", "4", "-n", "3", "-w", "1", "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """A healthy 2-rank all-reduce job: (its process, its JSON)."""
    out = tmp_path_factory.mktemp("allreduce") / "ar.json"
    proc = lab(*SMALL, "--json", str(out))
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def corrupted_below_the_floor(tmp_path_factory):
    """One job for two tests: rank 1 sends one wrong element, and a --min-busbw no CPU reaches. Neither hides
    the other: the check counts values, the gate reads the bandwidth (test_collectives.py's job does the same)."""
    out = tmp_path_factory.mktemp("allreduce") / "ar.json"
    proc = lab(*SMALL, "--json", str(out), "--min-busbw", "1e9", env={"LAB_ALLREDUCE_CORRUPT_RANK": "1"}, check=False)
    return proc, json.loads(out.read_text())


def test_allreduce_two_ranks_rows_and_definitions(healthy):
    proc, result = healthy
    assert [r["size"] for r in result["rows"]] == [8, 32, 128, 512, 2048, 8192, 32768]
    for r in result["rows"]:
        assert r["count"] == r["size"] // 4 and r["type"] == "float" and r["redop"] == "sum" and r["root"] == -1
        assert r["oop_busbw"] == r["oop_algbw"] and r["ip_busbw"] == r["ip_algbw"]  # 2(n-1)/n = 1 for n = 2
        assert r["oop_algbw"] == pytest.approx(r["size"] / (r["oop_time_us"] * 1e-6) / 1e9)
        assert r["oop_wrong"] == 0 and r["ip_wrong"] == 0
    assert result["world_size"] == 2 and result["backend"] == "gloo" and len(result["devices"]) == 2
    assert "# Avg bus bandwidth    : " in proc.stdout and "# Out of bounds values : 0 OK" in proc.stdout
    assert re.search(r"^\s+8\s+2\s+float\s+sum\s+-1\s", proc.stdout, re.MULTILINE)


def test_allreduce_counts_wrong_elements_when_a_rank_is_corrupted(corrupted_below_the_floor):
    rows = corrupted_below_the_floor[1]["rows"]
    assert all(r["oop_wrong"] == 1 and r["ip_wrong"] == 1 for r in rows)  # exactly the one element sent wrong


def test_allreduce_gate_exits_3(corrupted_below_the_floor):
    proc, result = corrupted_below_the_floor
    assert proc.returncode == 3, proc.stderr
    assert "is below --min-busbw" in proc.stdout and result["gate_missed"]


def test_strong_scaling_one_and_two_processes_with_amdahls_fit(tmp_path):
    proc = lab(
        "bench",
        "scaling",
        "--mode",
        "strong",
        "--config",
        "smoke",
        "--set",
        "model.width=8",
        "--max-world-size",
        "2",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--global-batch",
        "32",
        "--json",
        str(tmp_path / "s.json"),
        "--plot",
        str(tmp_path / "s.png"),
    )
    result = json.loads((tmp_path / "s.json").read_text())
    rows = result["rows"]
    assert [(r["world_size"], r["global_batch_size"]) for r in rows] == [(1, 32), (2, 32)]
    one, two = rows
    assert two["efficiency"] == pytest.approx(two["samples_per_second"] / (2 * one["samples_per_second"]))
    assert two["karp_flatt"] == pytest.approx((1 / two["speedup"] - 1 / 2) / (1 - 1 / 2))
    assert one["communication_share"] is None and 0 <= two["communication_share"] < 1
    # the three parts of a step add up to it; no all-reduce to expose at world size 1
    for r in rows:
        assert sum(r["breakdown"].values()) == pytest.approx(r["step_seconds"])
    assert one["breakdown"]["exposed_communication_seconds"] == 0.0
    # two points determine Amdahl's fraction exactly (it reproduces the measured speedup at 2), unless
    # the speedup fell outside [1, 2] (noise, caches), where s stops at its bound
    fit = result["amdahl"]
    assert fit["points"] == 2 and "gustafson" not in result
    s = fit["serial_fraction"]
    if 1 <= two["speedup"] <= 2:
        assert fit["residual_rms"] < 1e-6 and 1 / (s + (1 - s) / 2) == pytest.approx(two["speedup"], abs=1e-6)
    else:
        assert s == (0.0 if two["speedup"] > 2 else 1.0)
    assert set(fit["projection"]) == {"8", "64", "512"}
    assert "Amdahl's law fitted (least squares)" in proc.stdout
    with Image.open(tmp_path / "s.png") as png:
        png.verify()


def test_memory_seven_billion_on_eight_devices(tmp_path):
    proc = lab("memory", "--params", "7e9", "--world-size", "8", "--device", "h100", "--json", str(tmp_path / "m.json"))
    rows = {r["strategy"]: r["total_bytes"] for r in json.loads((tmp_path / "m.json").read_text())["rows"]}
    assert rows["DDP"] == pytest.approx(112e9) and rows["ZeRO-3 / FSDP full shard"] == pytest.approx(14e9)
    assert "recommendation for h100 (80 GB): ZeRO-1" in proc.stdout
    hf = lab("memory", "--convention", "hf", "--world-size", "1")
    assert "18 bytes/parameter" in hf.stdout and "126.00 GB" in hf.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--params", "-5"], "--params -5: the parameter count must be positive"),
        (["--world-size", "0"], "--world-size 0: need at least 1 device"),
        (["--seq-len", "2048"], "give all five"),
    ],
)
def test_memory_bad_input_exits_2(args, message):
    proc = lab("memory", *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_memory_measured_ddp_replicates_and_fsdp_shards(tmp_path):
    from lab import compat

    if not compat.fsdp_runs_on_cpu():
        pytest.skip(
            "FSDP2 cannot run on CPU tensors with this torch (torch.cpu.Stream has no record_event, "
            "as in 2.6); lab memory --measure reports that in its FSDP row"
        )
    lab("memory", "--measure", "--measure-width", "8", "--world-size", "2", "--json", str(tmp_path / "m.json"))
    measured = json.loads((tmp_path / "m.json").read_text())["measured"]
    single, ddp, fsdp = measured["single"], measured["two_ranks"]["ddp"], measured["two_ranks"]["fsdp"]
    assert ddp["parameters_bytes"] == single["parameters_bytes"]  # DDP: a full replica per rank
    assert fsdp["parameters_bytes"] == pytest.approx(single["parameters_bytes"] / 2, rel=0.01)  # FSDP: half
    assert fsdp["optimizer_states_bytes"] == pytest.approx(single["optimizer_states_bytes"] / 2, rel=0.01)


def test_report_from_a_run_directory(tmp_path):
    runs = tmp_path / "runs"
    lab("train", "--config", "smoke", "--set", "model.width=8", "--set", f"run.output_dir={runs}", "--set", "run.id=r")
    lab("report", str(runs / "r"), "--out", str(tmp_path / "rep"))
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "| r | 1 | synthetic | cpu |" in report
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        with Image.open(tmp_path / "rep" / image) as png:
            png.verify()
    bad = lab("report", str(tmp_path / "nothing"), check=False)
    assert bad.returncode == 2 and "no such run directory or result file" in bad.stderr
