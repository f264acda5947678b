"""`lab accept RUN_DIR`: is this cluster accepted? One rule over what an acceptance run left (docs/acceptance.md):

    held (accepted) when validate.json says `"ok": true` (every node and all nodes together at or above their
    platform's floors, every fact check held or did not apply, DCGM's diagnostic among them), every GPU node's
    device check (`make gpu-check`, `lab gpu-check`) saw its GPUs, finished, and every step of it held or did not
    apply to the node's hardware (a step not run, for time, --only or a missing package, fails the node, named),
    and, where the play's output is given (--recap), every node's PLAY RECAP says failed=0 and unreachable=0.

    lab accept runs/accept-1 --recap accept-1.log                 # Ansible: the validate play's run and output
    lab accept runs/validate-slurm-ID-TIME-PID --device-checks runs/accept-1/device-check   # Slurm
    lab accept runs/accept-1 --platform h100-sxm-8                # and every node must be that platform

The device checks are read from DIR/NODE.json or DIR/NODE/gpu-check.json (DIR: --device-checks, default
RUN_DIR/device-check). A node without a GPU (platform cpu in validate.json) has no device check to run: it is
reported "not applicable" with that reason, never as held. `make gpu-check` exits 0 on a host where torch sees
no GPU (no step applies), so its exit code alone would pass a GPU node that tested nothing: the verdict reads
gpu-check.json's `gpu`, `finished` and each step's verdict (lab.verdict) instead.

Exit 0 held (accepted), 1 failed (each reason printed, one a line), 2 bad input (no such folder, an unreadable
validate.json, an unknown --platform). `floors_table()` renders the platforms' floors for docs/acceptance.md from
lab.measure.platforms, the one source of truth (tests/unit/test_acceptance.py holds the page to it).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lab.errors import EXIT_FAILED, EXIT_OK, LabError
from lab.measure import platforms
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, NOT_RUN, passes

RECAP = re.compile(r"^(\S+)\s+: ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
DEVICE_CHECKS = "device-check"  # RUN_DIR/device-check/NODE.json or NODE/gpu-check.json


# ----------------------------------------------------------------------------- the floors table


def _gbps(value: float) -> str:
    return f"{value:g}"


def floors_table() -> str:
    """The floors of every platform of lab.measure.platforms, as docs/acceptance.md shows them (markdown)."""
    gen5 = [{"name": "x", "pcie_gen_max": 5, "pcie_width_max": 16}]
    rows = [
        "| platform (`key`) | all GPUs of a node: healthy -> floor | without NVLS: healthy -> floor "
        "| one GPU pair: floor | all nodes: healthy -> floor | host<->device: floor |",
        "|---|---|---|---|---|---|",
    ]
    for p in platforms.PLATFORMS:
        floor, _ = platforms.floors(p, gen5 if p.pcie is None else [], [])
        if p.key == "cpu":
            cpu = f"{_gbps(platforms.CPU_FLOOR)} (the flow works)"
            rows.append(f"| {p.name} (`{p.key}`) | {cpu} | - | {cpu} | {cpu} | - |")
            continue
        gen, width = p.pcie or (5, 16)
        link = platforms.link_gbps(gen, width)
        if p.node_healthy_gbps is not None:
            node = f"{_gbps(p.node_healthy_gbps)} -> **{_gbps(floor['node'])}**"
        else:
            node = (
                f"none published: {_gbps(platforms.PCIE_LOOSE_FRACTION)} x each GPU's PCIe link "
                f"(**{_gbps(floor['node'])}** on Gen5 x16); record a baseline"
            )
        ring = (
            f"{_gbps(p.node_ring_gbps)} -> **{_gbps(platforms.floors(p, [], [], nvls=False)[0]['node'])}**"
            if p.node_ring_gbps is not None
            else "-"
        )
        pair = f"**{_gbps(floor['pair'])}**" if p.pair_floor_gbps is not None else "as the node"
        if p.ib is not None:
            count, rate, width_ib = p.ib
            healthy = round(platforms.NIC_EFFICIENCY * count * rate / 8, 1)
            nodes = f"{count} x {_gbps(rate)} Gb/s {width_ib}: {_gbps(healthy)} -> **{_gbps(floor['nodes'])}**"
        else:
            nodes = (
                f"{_gbps(platforms.FLOOR_FRACTION)} x {_gbps(platforms.NIC_EFFICIENCY)} x the line rate of the Active "
                f"InfiniBand ports found ({_gbps(platforms.CPU_FLOOR)} without any)"
            )
        host = (
            f"Gen{gen} x{width} ({link:.3g}): **{_gbps(floor['host_device'])}**"
            if p.pcie is not None
            else f"{_gbps(platforms.HOST_DEVICE_FRACTION)} x the link each GPU reports "
            f"(**{_gbps(floor['host_device'])}** on Gen5 x16)"
        )
        rows.append(f"| {p.name} (`{p.key}`) | {node} | {ring} | {pair} | {nodes} | {host} |")
    return "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- the verdict


def _read_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
    if not isinstance(doc, dict):
        return None, "unreadable (not a JSON object)"
    return doc, None


def device_check(folder: Path, node: str) -> tuple[str, str]:
    """(verdict, why) of NODE's device check in `folder`: held, failed, or not run (no record of one)."""
    for path in (folder / f"{node}.json", folder / node / "gpu-check.json"):
        if path.exists():
            break
    doc, unreadable = _read_json(path)
    if doc is None:
        where = f"{folder / (node + '.json')} or {folder / node / 'gpu-check.json'}"
        return NOT_RUN, f"no device check ({unreadable}: {where}); run make gpu-check on the node"
    steps = doc.get("steps") or []
    if not doc.get("gpu"):
        return FAILED, f"its device check saw no GPU ({path}): it tested nothing of the node's GPUs"
    failed = [s for s in steps if s.get("verdict") == FAILED]
    if failed:
        first = failed[0]
        return FAILED, f"device check step {first.get('step')!r} failed: {first.get('detail', '')} ({path})"
    not_run = [s for s in steps if s.get("verdict") not in (HELD, NOT_APPLICABLE)]  # an unknown word is not a pass
    if not_run:
        first = not_run[0]
        named = ", ".join(repr(s.get("step")) for s in not_run)
        return FAILED, (f"its device check is incomplete: step(s) {named} not run ({first.get('detail', '')}) ({path})")
    if not doc.get("finished"):
        return FAILED, f"its device check did not finish (stopped before its last step) ({path})"
    ran = sum(s.get("verdict") == HELD for s in steps)
    return HELD, f"device check: {ran} step(s) held on {doc.get('gpus')} x {doc.get('device')}"


def recap(text: str) -> dict[str, tuple[int, int]]:
    """{host: (unreachable, failed)} from ansible-playbook's PLAY RECAP lines."""
    return {host: (int(unreachable), int(failed)) for host, unreachable, failed in RECAP.findall(text)}


def judge(
    run_dir: str | Path,
    device_checks: str | Path | None = None,
    recap_text: str | None = None,
    platform: str | None = None,
) -> dict[str, Any]:
    """The acceptance verdict of `run_dir` (validate.json there): {"verdict", "reasons": [why it fails], "notes": [what
    was not applicable, and why], "nodes": {NAME: {"platform", "validate", "device_check", "why"}}}. Reads files,
    writes none. LabError (bad input) when run_dir has no readable validate.json or `platform` is unknown."""
    run = Path(run_dir)
    validate = _validate_json(run, platform)
    folder = Path(device_checks) if device_checks is not None else run / DEVICE_CHECKS
    reasons = [f"validate.json: {problem}" for problem in validate.get("problems") or []]
    if not validate["ok"] and not reasons:
        reasons.append("validate.json: ok is false")
    nodes, node_reasons, notes = _nodes(validate["nodes"], folder, platform)
    reasons += node_reasons
    if recap_text is not None:
        reasons += recap_reasons(recap_text, nodes)
    verdict = HELD if not reasons else FAILED
    return {"verdict": verdict, "reasons": reasons, "notes": notes, "nodes": nodes, "run_id": validate.get("run_id")}


def _validate_json(run: Path, platform: str | None) -> dict[str, Any]:
    """The run's validate.json; LabError (bad input) when there is no such folder or document, or `platform` is
    unknown."""
    if not run.is_dir():
        raise LabError(f"lab accept: {run}: no such folder; give the run folder that holds validate.json")
    if platform is not None and platform not in platforms.BY_KEY:
        raise LabError(f"lab accept --platform {platform}: unknown; use one of {', '.join(platforms.BY_KEY)}")
    validate, unreadable = _read_json(run / "validate.json")
    if validate is None or not isinstance(validate.get("nodes"), dict) or "ok" not in validate:
        why = unreadable or "not lab validate's document (no ok, no nodes)"
        raise LabError(
            f"lab accept: {run / 'validate.json'}: {why}; give the folder where the validate play or "
            f"slurm/validate.sbatch wrote it (runs/<run id>/)"
        )
    return validate


def _nodes(records: dict[str, Any], folder: Path, platform: str | None) -> tuple[dict[str, Any], list[str], list[str]]:
    """({NAME: its platform and device check's verdict and why}, the reasons they fail the cluster, the notes): each
    GPU node's device check in `folder`, and its platform where one is asked for."""
    nodes: dict[str, Any] = {}
    reasons: list[str] = []
    notes: list[str] = []
    for name, record in records.items():
        key = (record.get("platform") or {}).get("key", "unknown")
        if key == "cpu":
            verdict, why = NOT_APPLICABLE, f"{name} has no GPU (platform cpu): no device check to run"
            notes.append(why)
        else:
            verdict, why = device_check(folder, name)
            if not passes(verdict):
                reasons.append(f"{name}: {why}")
        if platform is not None and key != platform:
            reasons.append(f"{name}: platform {key}, not {platform} (--platform): {record['platform'].get('why', '')}")
        nodes[name] = {"platform": key, "device_check": verdict, "why": why}
    return nodes, reasons, notes


def recap_reasons(text: str, nodes: Iterable[str]) -> list[str]:
    """Why the play's output fails the cluster: no PLAY RECAP line, a node missing from it, or one with a failed or
    unreachable task."""
    seen = recap(text)
    reasons = [] if seen else ["--recap: no PLAY RECAP line in the play's output"]
    for host in sorted(set(nodes) | set(seen)):
        if host not in seen:
            reasons.append(f"{host}: not in the PLAY RECAP (did it play?)")
        elif seen[host] != (0, 0):
            unreachable, failed = seen[host]
            reasons.append(f"{host}: PLAY RECAP failed={failed} unreachable={unreachable}")
    return reasons


def run(args: argparse.Namespace) -> int:
    """`lab accept`: the verdict (held: accepted; failed: not) with each reason and each note; exit 0 or 1."""
    recap_text = None
    if args.recap:
        try:
            recap_text = Path(args.recap).read_text()
        except OSError as exc:
            raise LabError(
                f"lab accept --recap {args.recap}: {exc.strerror or exc}; give the play's saved output"
            ) from None
    judged = judge(args.run_dir, args.device_checks, recap_text, args.platform)
    for reason in judged["reasons"]:
        print(f"{FAILED:<14}  {reason}")
    for note in judged["notes"]:
        print(f"{NOT_APPLICABLE:<14}  {note}")
    for name, node in judged["nodes"].items():
        print(f"node  {name}: platform {node['platform']}; device check {node['device_check']}")
    count = len(judged["reasons"])
    accepted = judged["verdict"] == HELD
    said = "held: accepted" if accepted else f"failed: not accepted ({count} reason{'s' if count > 1 else ''})"
    print(f"accept: {said}: {args.run_dir}")
    return EXIT_OK if accepted else EXIT_FAILED
