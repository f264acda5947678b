"""`lab bench collective` over two real gloo ranks, every op in one torchrun job: nccl-tests' columns and
definitions, exact results, a corrupted op counted, a floor nobody reaches judged from every op's JSON."""

from __future__ import annotations

import json
import re

import pytest

from lab.measure.bench.comm.collective import COLLECTIVES, NAMES
from tests.conftest import lab


def test_every_collective_in_one_job_follows_nccl_tests(tmp_path):
    # One start for everything (each costs seconds): rank 1 corrupts sendrecv alone; the floor is impossible.
    proc = lab(
        "bench",
        "collective",
        "all",
        "-b",
        "8",
        "-e",
        "32K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "1",
        "--nproc-per-node",
        "2",
        "--json",
        str(tmp_path / "c.json"),
        "--min-busbw",
        "1e9",
        env={"LAB_COLLECTIVE_CORRUPT_RANK": "1:sendrecv"},
        check=False,
    )
    assert proc.returncode == 3, proc.stderr  # judged by the parent from the six files
    assert "# on gloo: gloo has no reduce-scatter" in proc.stdout  # the ring over send/recv, said so
    for name in NAMES:
        result = json.loads((tmp_path / f"c-{name}.json").read_text())
        coll, rows = COLLECTIVES[name], result["rows"]
        assert result["benchmark"] == "collective" and result["collective"] == name and result["gate_missed"]
        assert result["world_size"] == 2 and result["backend"] == "gloo" and len(result["devices"]) == 2
        assert result["op"] == ("sum" if coll.reduces else "none")
        assert set(rows[0]) == {
            "size",
            "count",
            "type",
            "redop",
            "root",
            "oop_time_us",
            "oop_algbw",
            "oop_busbw",
            "oop_wrong",
            "ip_time_us",
            "ip_algbw",
            "ip_busbw",
            "ip_wrong",
        }
        # per rank: the count is per rank (whole 16-byte blocks), the size n times it; 8 B holds no block
        sizes = [64, 512, 4096, 32768] if coll.per_rank else [8, 64, 512, 4096, 32768]
        assert [r["size"] for r in rows] == sizes, name
        for r in rows:
            assert r["count"] * 4 * (2 if coll.per_rank else 1) == r["size"] and r["type"] == "float"
            assert r["root"] == (0 if name == "broadcast" else -1)
            for placement in ("oop", "ip"):
                assert r[f"{placement}_algbw"] == pytest.approx(r["size"] / (r[f"{placement}_time_us"] * 1e-6) / 1e9)
                assert r[f"{placement}_busbw"] == pytest.approx(r[f"{placement}_algbw"] * coll.factor(2))
            wrong = 1 if name == "sendrecv" else 0  # rank 0 receives rank 1's wrong element
            assert r["oop_wrong"] == wrong and r["ip_wrong"] == (0 if coll.in_place_checked else None), name
        assert result["avg_busbw"] == pytest.approx(sum(r["oop_busbw"] + r["ip_busbw"] for r in rows) / (2 * len(rows)))
    assert json.loads((tmp_path / "c-reduce_scatter.json").read_text())["definitions"]["on_gloo"].startswith("gloo")
    assert proc.stdout.count("# Out of bounds values : 0 OK") == 5
    assert "# Out of bounds values : 5 FAILED" in proc.stdout
    assert "# FAILED: average bus bandwidth of alltoall " in proc.stdout and "is below --min-busbw 1e+09" in proc.stdout
    assert re.search(r"^\s+8\s+2\s+float\s+none\s+0\s", proc.stdout, re.MULTILINE)  # broadcast's row: root 0
    assert re.search(r"^\s+64\s+8\s+float\s+none\s+-1\s.*\s+N/A$", proc.stdout, re.MULTILINE)  # alltoall in-place
    assert "# Avg bus bandwidth (GB/s) by collective: all_reduce " in proc.stdout
