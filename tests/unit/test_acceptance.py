"""Accepting a cluster: docs/acceptance.md's floors are lab/measure/platforms.py's own, no other page restates one
apart from the table, and `lab accept`'s rule (lab.machine.health.acceptance) passes and fails what it should. The rule
on
real runs of the validate play: tests/infra/test_ansible.py (a passing two-node run, a failing three-node one)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from lab.errors import LabError
from lab.machine.health import acceptance
from lab.machine.health.arguments import accept_args
from lab.measure import platforms
from tests.conftest import ROOT

PAGE = ROOT / "docs" / "acceptance.md"
TABLE = re.compile(r"<!-- floors: generated .*?-->\n(.*?)<!-- end of floors -->", re.S)


def _page_table() -> str:
    found = TABLE.search(PAGE.read_text())
    assert found, "docs/acceptance.md lost its floors table markers"
    return found.group(1)


def test_the_floors_table_of_the_acceptance_page_is_the_one_platforms_py_makes():
    assert _page_table() == acceptance.floors_table(), (
        "docs/acceptance.md's floors differ from lab/measure/platforms.py: paste "
        "`python -c 'from lab.machine.health import acceptance; print(acceptance.floors_table(), end=\"\")'` "
        "between the markers"
    )
    assert "470 -> **376**" in _page_table() and "376 -> **300.8**" in _page_table()  # 8 x H100, 8 x NDR


def test_a_changed_platform_makes_the_table_disagree(monkeypatch):
    h100 = platforms.BY_KEY["h100-sxm-8"]
    faster = dataclasses.replace(h100, node_healthy_gbps=500.0)
    monkeypatch.setattr(platforms, "PLATFORMS", (faster, *platforms.PLATFORMS[1:]))
    assert "500 -> **400**" in acceptance.floors_table() and acceptance.floors_table() != _page_table()


def _floors() -> set[float]:
    """Every floor the named platforms have (GB/s), with and without NVLS, as the table shows them."""
    found = set()
    for p in platforms.PLATFORMS[:3]:
        for nvls in (True, False):
            found |= set(platforms.floors(p, [], [], nvls=nvls)[0].values())
    return found


QUOTED = re.compile(r"(?<![\d.,])(\d+(?:\.\d+)?)\s*GB/s|--min-busbw\s+(\d+(?:\.\d+)?)")
# the pages that judge a fabric or show its floors (others quote link speeds such as NVLink 2's 150 GB/s)
PAGES = [
    *(
        ROOT / "docs" / page
        for page in (
            "multi-node.md",
            "slurm.md",
            "benchmarks.md",
            "containers.md",
            "workshop.md",
            "workshop-reference.md",
        )
    ),
    ROOT / "README.md",
    ROOT / "playbooks" / "inventory" / "dgx.example.yml",
    ROOT / "playbooks" / "roles" / "validate" / "defaults" / "main.yml",
    ROOT / "slurm" / "validate.sbatch",
]


def test_no_page_restates_a_floor_unless_it_links_to_the_table_and_agrees_with_it():
    floors = _floors() - {200.0, 135.0}  # the pair floors: round numbers other figures share (200 Gb/s HDR)
    restated = []
    for page in PAGES:
        if page == PAGE:
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in QUOTED.finditer(line):
                value = float(match.group(1) or match.group(2))
                near = any(abs(value - floor) < 1.0 for floor in floors)
                if near and ("acceptance.md#floors" not in line or value not in floors):
                    restated.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not restated, "link to docs/acceptance.md#floors instead of restating a floor:\n" + "\n".join(restated)


# ----------------------------------------------------------------------------- the rule


def _gpu_check(gpu: bool = True, failed: str | None = None, finished: bool = True, not_run: str | None = None) -> dict:
    steps = [{"step": "doctor", "verdict": "held", "detail": "", "by_deadline": False}]
    steps.append(
        {"step": "all-reduce", "verdict": "not applicable", "detail": "1 GPU on this host", "by_deadline": False}
    )
    if failed:
        steps.append({"step": failed, "verdict": "failed", "detail": "exit 1: boom", "by_deadline": False})
    if not_run:
        left = "left out to keep the plan within 75% of the 360 s deadline"
        steps.append({"step": not_run, "verdict": "not run", "detail": left, "by_deadline": False})
    return {"benchmark": "gpu-check", "gpu": gpu, "gpus": 8 if gpu else 0, "device": "NVIDIA H100 80GB HBM3",
            "finished": finished, "steps": steps}  # fmt: skip


def _run(tmp_path: Path, keys: dict[str, str], ok: bool = True, problems: list[str] | None = None) -> Path:
    run = tmp_path / "accept-1"
    run.mkdir()
    nodes = {name: {"platform": {"key": key, "name": key, "why": f"8 x GPU on {name}"}} for name, key in keys.items()}
    doc = {"check": "validate", "run_id": "accept-1", "ok": ok, "problems": problems or [], "nodes": nodes}
    (run / "validate.json").write_text(json.dumps(doc))
    return run


def _device(run: Path, node: str, doc: dict, nested: bool = False) -> None:
    path = run / "device-check" / node / "gpu-check.json" if nested else run / "device-check" / f"{node}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_gpu_nodes_pass_with_validate_ok_and_a_device_check_that_saw_gpus_on_each(tmp_path):
    run = _run(tmp_path, {"dgx-01": "h100-sxm-8", "dgx-02": "h100-sxm-8"})
    _device(run, "dgx-01", _gpu_check())
    _device(run, "dgx-02", _gpu_check(), nested=True)  # a make gpu-check folder per node does too
    verdict = acceptance.judge(run, platform="h100-sxm-8")
    assert verdict["verdict"] == "held" and verdict["reasons"] == [] and verdict["notes"] == []
    assert {n["device_check"] for n in verdict["nodes"].values()} == {"held"}


@pytest.mark.parametrize(
    "device, said",
    [
        (None, "dgx-02: no device check (missing: "),
        (_gpu_check(gpu=False), "dgx-02: its device check saw no GPU"),  # make gpu-check's exit 0 without a GPU
        (_gpu_check(failed="FSDP"), "dgx-02: device check step 'FSDP' failed: exit 1: boom"),
        (_gpu_check(finished=False), "dgx-02: its device check did not finish"),
        # a step left out for time, --only or a missing package: the node's GPU paths were not all tested
        (_gpu_check(not_run="predict"), "dgx-02: its device check is incomplete: step(s) 'predict' not run (left out"),
    ],
)
def test_a_gpu_node_whose_device_check_is_missing_blind_failed_cut_or_incomplete_fails_the_cluster(
    tmp_path, device, said
):
    run = _run(tmp_path, {"dgx-01": "h100-sxm-8", "dgx-02": "h100-sxm-8"})
    _device(run, "dgx-01", _gpu_check())
    if device is not None:
        _device(run, "dgx-02", device)
    verdict = acceptance.judge(run)
    assert verdict["verdict"] == "failed" and len(verdict["reasons"]) == 1, verdict
    assert verdict["reasons"][0].startswith(said), verdict


def test_validate_problems_a_wrong_platform_and_a_failed_recap_each_fail_naming_why(tmp_path):
    problem = "dgx-02: all-reduce of 8 GPUs: busbw 290 GB/s, below its floor 376 GB/s"
    run = _run(tmp_path, {"dgx-01": "h100-sxm-8", "dgx-02": "gpu"}, ok=False, problems=[problem])
    for node in ("dgx-01", "dgx-02"):
        _device(run, node, _gpu_check())
    recap = (
        "PLAY RECAP *****\n"
        "dgx-01                     : ok=40   changed=12   unreachable=0    failed=0    skipped=3\n"
        "dgx-02                     : ok=38   changed=12   unreachable=0    failed=1    skipped=3\n"
    )
    verdict = acceptance.judge(run, recap_text=recap, platform="h100-sxm-8")
    assert verdict["reasons"] == [
        f"validate.json: {problem}",
        "dgx-02: platform gpu, not h100-sxm-8 (--platform): 8 x GPU on dgx-02",
        "dgx-02: PLAY RECAP failed=1 unreachable=0",
    ]
    missing = acceptance.judge(run, recap_text="PLAY RECAP ***\ndgx-01 : ok=1 changed=0 unreachable=0 failed=0\n")
    assert "dgx-02: not in the PLAY RECAP (did it play?)" in missing["reasons"]


def test_a_cpu_node_has_no_device_check_to_run_and_is_said_so_never_passed(tmp_path):
    run = _run(tmp_path, {"127.0.0.1": "cpu"})
    verdict = acceptance.judge(run)
    assert verdict["verdict"] == "held" and verdict["nodes"]["127.0.0.1"]["device_check"] == "not applicable"
    assert verdict["notes"] == ["127.0.0.1 has no GPU (platform cpu): no device check to run"]
    assert acceptance.judge(run, platform="h100-sxm-8")["verdict"] == "failed"  # a DGX that showed no GPU is no DGX


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab accept")
    accept_args(parser)
    return parser.parse_args(list(argv))


def test_the_command_prints_the_verdict_and_exits_0_or_1(tmp_path, capsys):
    run = _run(tmp_path, {"dgx-01": "h100-sxm-8"})
    assert acceptance.run(_args(str(run))) == 1
    out = capsys.readouterr().out
    assert out.startswith("failed          dgx-01: no device check")
    assert out.endswith(f"accept: failed: not accepted (1 reason): {run}\n")
    _device(run, "dgx-01", _gpu_check())
    assert acceptance.run(_args(str(run), "--platform", "h100-sxm-8")) == 0
    assert capsys.readouterr().out.endswith(f"accept: held: accepted: {run}\n")


def test_bad_input_is_one_line_naming_what_and_what_would_do(tmp_path):
    cases = [
        (_args(str(tmp_path / "nowhere")), "no such folder; give the run folder that holds validate.json"),
        (_args(str(tmp_path)), "validate.json: missing; give the folder where the validate play"),
        (_args(str(tmp_path), "--platform", "h100"), "--platform h100: unknown; use one of h100-sxm-8, h200-sxm-8"),
        (_args(str(tmp_path), "--recap", str(tmp_path / "no.log")), "--recap "),
    ]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "validate.json").write_text("{not json")
    cases.append((_args(str(tmp_path / "broken")), "validate.json: unreadable (JSONDecodeError"))
    for args, said in cases:
        with pytest.raises(LabError, match=re.escape(said)) as refused:
            acceptance.run(args)
        assert "\n" not in str(refused.value)


def _wired() -> bool:
    from lab import cli

    return any(command.name == "accept" for command in cli.COMMANDS)


@pytest.mark.skipif(not _wired(), reason="`lab accept` is not in lab/cli.py's table of commands yet")
def test_lab_accept_exits_0_on_pass_1_on_fail_and_2_with_one_line_on_bad_input(tmp_path, capsys):
    from lab import cli

    run = _run(tmp_path, {"dgx-01": "h100-sxm-8"})
    assert cli.main(["accept", str(run)]) == 1
    _device(run, "dgx-01", _gpu_check())
    assert cli.main(["accept", str(run), "--platform", "h100-sxm-8"]) == 0
    assert capsys.readouterr().out.endswith(f"accept: held: accepted: {run}\n")
    assert cli.main(["accept", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such folder" in err and "Traceback" not in err
