"""`lab validate`: a Slurm validation job's all-reduce results judged into the validate.json the Ansible role writes,
and `lab report` reading it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lab import cli
from lab.bench import fabric
from lab.errors import LabError
from lab.teaching import report
from tests.markdown import problems

ROOT = Path(__file__).resolve().parents[2]


def _allreduce(world_size: int = 2, busbw: float = 0.2, gpus: bool = False, wrong: int = 0) -> dict:
    """A `lab bench allreduce --json` result in the shape a real run writes (two sizes; device names per rank)."""
    def row(size: int, oop_wrong: int) -> dict:
        return {"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": -1,
                "oop_time_us": 100.0, "oop_algbw": busbw, "oop_busbw": busbw, "oop_wrong": oop_wrong,
                "ip_time_us": 100.0, "ip_algbw": busbw, "ip_busbw": busbw, "ip_wrong": 0}
    return {"benchmark": "allreduce", "world_size": world_size, "backend": "nccl" if gpus else "gloo",
            "dtype": "float32", "op": "sum", "iters": 2, "warmup_iters": 1,
            "definitions": {"algbw": "bytes / time, GB/s (1e9)", "busbw": "algbw * 2 (n-1) / n"},
            "rows": [row(65536, wrong), row(262144, 0)], "avg_busbw": busbw, "link": None, "link_gbps": None,
            "min_busbw": None, "gate_missed": False, "hosts": ["vm"],
            "devices": ["NVIDIA H200"] * world_size if gpus else ["cpu"] * world_size, "environment": {}}


def _folder(tmp_path: Path, files: dict[str, dict | str]) -> Path:
    folder = tmp_path / "validate"
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


def _gpu_job(tmp_path: Path, **changes: dict | str | None) -> Path:
    """Two 8-GPU nodes and all of them together, healthy; `changes` replace (None: remove) a file."""
    files = {"node-a.json": _allreduce(8, 350.0, gpus=True), "node-b.json": _allreduce(8, 340.0, gpus=True),
             "nodes.json": _allreduce(16, 150.0, gpus=True), **changes}
    return _folder(tmp_path, {name: content for name, content in files.items() if content is not None})


def test_the_default_floors_are_the_validate_roles():
    defaults = yaml.safe_load((ROOT / "playbooks/roles/validate/defaults/main.yml").read_text())
    assert fabric.DEFAULT_FLOORS == defaults["validate_default_floors"]


def test_healthy_gpu_nodes_pass_with_every_key_the_report_reads(tmp_path):
    doc = fabric.verdict(_gpu_job(tmp_path), ["a", "b"], "v1")
    assert doc["ok"] and doc["problems"] == [] and doc["check"] == "validate" and doc["platform"] == "slurm"
    assert doc["run_id"] == "v1" and doc["ring"] == {} and doc["suspects"] == []
    assert "--floor" in doc["definitions"]["floor"] and "busbw" in doc["definitions"]
    a = doc["nodes"]["a"]
    assert a["gpus"] == 8 and a["floors"] == fabric.DEFAULT_FLOORS and a["health"] == fabric.NOT_READ_HEALTH
    assert a["pairs"] == [{"pair": "0,1,2,3,4,5,6,7", "rc": None, "avg_busbw": 350.0, "floor": 200.0, "ok": True,
                           "error": None, "wrong": 0}]
    assert doc["all_nodes"] == {"hosts": ["a", "b"], "world_size": 16, "avg_busbw": 150.0, "floor": 100.0,
                                "wrong": 0, "ok": True}
    assert set(doc["runs"]) == {"a", "b"} and "nodes" in doc["runs"]["a"]


def test_a_cpu_node_is_two_cpu_processes_against_the_cpu_floor(tmp_path):
    folder = _folder(tmp_path, {"node-a.json": _allreduce(), "node-b.json": _allreduce(), "nodes.json": _allreduce(4)})
    doc = fabric.verdict(folder, ["a", "b"], "v1", {"nodes": 0.01})
    assert doc["ok"], doc["problems"]
    assert doc["nodes"]["b"]["gpus"] == 0 and doc["nodes"]["b"]["pairs"][0]["pair"] == "cpu"
    assert doc["nodes"]["b"]["pairs"][0]["floor"] == 0.01


def test_a_node_below_its_floor_is_named_with_its_figure(tmp_path):
    doc = fabric.verdict(_gpu_job(tmp_path, **{"node-b.json": _allreduce(8, 60.0, gpus=True)}), ["a", "b"], "v1")
    assert not doc["ok"]
    assert doc["problems"] == ["b: all-reduce of GPUs 0,1,2,3,4,5,6,7: busbw 60 GB/s, below its floor 200 GB/s"]


def test_floors_from_the_command_line_replace_the_defaults(tmp_path):
    doc = fabric.verdict(_gpu_job(tmp_path), ["a", "b"], "v1", fabric.parse_floors(["gpu_pair=345", "nodes=200"]))
    assert doc["problems"] == ["b: all-reduce of GPUs 0,1,2,3,4,5,6,7: busbw 340 GB/s, below its floor 345 GB/s",
                               "all nodes: 16 ranks: busbw 150 GB/s, below 200 GB/s, the highest floor among them"]


def test_a_node_that_wrote_nothing_is_reported_with_its_logs_last_line(tmp_path):
    folder = _gpu_job(tmp_path, **{"node-b.json": None,
                                   "node-b.log": "starting\nRuntimeError: NCCL error: unhandled system error\n\n"})
    doc = fabric.verdict(folder, ["a", "b", "c"], "v1")
    assert doc["problems"][:2] == [
        "b: all-reduce of GPUs 0,1,2,3,4,5,6,7: no result: RuntimeError: NCCL error: unhandled system error",
        "c: all-reduce of GPUs 0,1,2,3,4,5,6,7: no result: no node-c.json and no node-c.log"]
    b = doc["nodes"]["b"]["pairs"][0]
    assert b["avg_busbw"] is None and not b["ok"] and b["error"].startswith("RuntimeError")
    assert doc["nodes"]["c"]["gpus"] == 8  # what the job asked of every node, as the others that wrote show


def test_wrong_results_fail_a_check_even_above_its_floor(tmp_path):
    folder = _gpu_job(tmp_path, **{"node-a.json": _allreduce(8, 350.0, gpus=True, wrong=3),
                                   "nodes.json": _allreduce(16, 150.0, gpus=True, wrong=1)})
    doc = fabric.verdict(folder, ["a", "b"], "v1")
    assert doc["problems"] == [
        "a: all-reduce of GPUs 0,1,2,3,4,5,6,7: 3 wrong elements (busbw 350 GB/s, floor 200 GB/s)",
        "all nodes: 16 ranks: 1 wrong elements (busbw 150 GB/s, floor 100 GB/s)"]
    assert doc["nodes"]["a"]["pairs"][0]["wrong"] == 3 and doc["all_nodes"]["wrong"] == 1
    assert not doc["all_nodes"]["ok"]


def test_all_nodes_missing_names_the_heads_log_line(tmp_path):
    folder = _gpu_job(tmp_path, **{"nodes.json": None, "nodes.log": "torch.distributed.DistStoreError: timed out\n"})
    doc = fabric.verdict(folder, ["a", "b"], "v1")
    assert doc["all_nodes"] is None and doc["runs"]["a"]["nodes"]["last_line"].startswith("torch.distributed")
    assert doc["problems"] == ["all nodes: the all-reduce did not complete: a: torch.distributed.DistStoreError: "
                               "timed out"]
    without_log = fabric.verdict(_gpu_job(tmp_path / "2", **{"nodes.json": None}), ["a", "b"], "v1")
    assert without_log["problems"] == ["all nodes: the all-reduce did not complete: a: no nodes.json and no nodes.log"]


def test_a_health_file_replaces_not_read_and_a_failed_diagnostic_is_a_problem(tmp_path):
    health = {"dcgm_diag": "fail: Memory test failed", "xid_events": 2, "ecc_uncorrected": {"0": "0"},
              "dcgm_level": 1}
    doc = fabric.verdict(_gpu_job(tmp_path, **{"health-b.json": health}), ["a", "b"], "v1")
    assert doc["nodes"]["b"]["health"] == health and doc["nodes"]["a"]["health"] == fabric.NOT_READ_HEALTH
    assert doc["problems"] == ["b: dcgmi diag -r 1: fail: Memory test failed"]


def test_a_result_that_is_not_an_allreduce_json_is_the_nodes_problem(tmp_path):
    doc = fabric.verdict(_gpu_job(tmp_path, **{"node-a.json": "{\"rows\": "}), ["a", "b"], "v1")
    assert doc["problems"][0].startswith("a: all-reduce of GPUs 0,1,2,3,4,5,6,7: no result: node-a.json: not "
                                         "readable JSON")


def test_the_report_renders_the_written_validate_json(tmp_path, capsys):
    folder = _gpu_job(tmp_path, **{"node-b.json": _allreduce(8, 60.0, gpus=True)})
    out = tmp_path / "run" / "validate.json"
    code = cli.main(["validate", str(folder), "--nodes", "a,b", "--run-id", "v1", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert code == 1 and printed == ["b: all-reduce of GPUs 0,1,2,3,4,5,6,7: busbw 60 GB/s, below its floor 200 GB/s",
                                     f"validate: FAILED (1 problem); every figure: {out}"]
    text = report.build([str(out)], str(tmp_path / "run")).read_text()
    assert "## Fabric validation" in text and "Verdict: FAILED" in text
    assert "| GPUs 0,1,2,3,4,5,6,7 | b | 8 | 60 | 200 | below |" in text
    assert "| all nodes | a, b | 16 | 150 | 100 | ok |" in text
    assert "| a | 8 | not run (Slurm validation job) | not read | not read |" in text
    assert problems(text) == []


def test_a_passed_check_exits_0(tmp_path, capsys):
    out = tmp_path / "validate.json"
    assert cli.main(["validate", str(_gpu_job(tmp_path)), "--nodes", "a,b", "--run-id", "v1", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"validate: passed; every figure: {out}\n"
    assert json.loads(out.read_text())["ok"] is True


@pytest.mark.parametrize("extra, names", [
    (["--floor", "gpu=200"], "unknown key 'gpu'"),
    (["--floor", "nodes=fast"], "'fast' is not a number"),
    (["--floor", "nodes=-1"], "not a finite number >= 0"),
    (["--nodes", "a,,b"], "--nodes 'a,,b'"),
    (["--nodes", "a,a"], "a node is named twice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, names):
    args = ["validate", str(_gpu_job(tmp_path)), "--nodes", "a,b", "--run-id", "v1", "--out",
            str(tmp_path / "v.json"), *extra]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and not (tmp_path / "v.json").exists()


def test_a_folder_that_does_not_exist_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert cli.main(["validate", str(missing), "--nodes", "a", "--run-id", "v1", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such folder" in err and str(missing) in err


def test_verdict_refuses_an_unknown_floor_key_from_python_too(tmp_path):
    with pytest.raises(LabError, match="unknown key 'gpu'"):
        fabric.verdict(_gpu_job(tmp_path), ["a", "b"], "v1", {"gpu": 1.0})
