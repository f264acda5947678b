"""`lab validate DIR`: the fabric check's verdict. Each node's platform is picked from its facts (GPU model and count,
NVSwitch, InfiniBand; lab.measure.platforms), every figure is judged against that platform's floors at the sizes that
matter, every fact against what the node should have (lab.machine.health.fabric_checks), and all of it goes to
validate.json,
the document `lab report` renders. slurm/validate.sbatch and the Ansible validate role both call it.

    lab validate runs/v1/validate --nodes dgx01,dgx02 --run-id v1 --out runs/v1/validate.json
    lab validate DIR --nodes a,b --run-id v1 --out v.json --floor node=400 --floor b:nodes=150 --expect xid_max=2
    lab validate DIR --nodes a,b --run-id v1 --out v.json --record-baseline healthy.json    # a healthy cluster
    lab validate DIR --nodes a,b --run-id v2 --out v.json --baseline healthy.json          # fail under 80% of it

What DIR holds (each file may be missing: its absence is a problem or a "not run", never bad input):
    facts-NAME/               scripts/node-facts.sh's output for node NAME (NAME.txt, NAME.rc per fact)
    node-NAME.json/.log       `lab bench allreduce --json` over all of node NAME's GPUs (two CPU processes without):
                              the primary per-node test
    pair-NAME-I-J.json/.log   optional: GPU pair I,J of node NAME (where there is no NVSwitch, or on request)
    hostdevice-NAME.json/.log optional: `lab bench hostdevice --json` on node NAME (pinned copies, d2d matrix)
    nodes.json/.log           one all-reduce over every node (rank 0's JSON; the log with NCCL_DEBUG=INFO, whose
                              "via NET/IB/<n>/GDRDMA" lines show GPUDirect RDMA)
    ring-A_B.json/.log        optional: nodes A and B together (the ring search, when all nodes are slow)

validate.json: {"check": "validate", "platform": the runner ("slurm" or "ansible"), "run_id", "ok",
    "problems": ["NODE: what: why", "all nodes: ...", ...], "definitions": {...}, "judged": what figure is judged,
    "nodes": {NAME: {"gpus", "platform": {"key", "name", "why"}, "floors": {"node", "pair", "nodes", "host_device",
             ["d2d"]}, "floor_sources": {KEY: where from}, "pairs": [{"pair", "rc", "avg_busbw", "busbw",
             "judged_at", "floor", "ok", "error", "wrong"}], "hostdevice": {...} | null, "facts": {parsed},
             "checks": [{"name", "verdict", "detail"}], "health": {"dcgm_diag", "xid_events", "ecc_uncorrected"}}},
    "all_nodes": {"hosts", "world_size", "avg_busbw", "busbw", "judged_at", "floor", "wrong", "ok"} | null,
    "ring": {"A+B": {same keys as all_nodes}}, "ring_needed": bool, "suspects": [NAME], "failed_nodes": {NAME:
    its first reason}, "baseline": {"file", "fraction"} | null, "runs": {NAME: {"node": {"result", "log",
    "last_line"}, ["nodes": {...}]}}}
failed-nodes.tsv beside validate.json: NAME<TAB>its first reason, a line a failed node (empty when all passed):
what slurm/validate.sbatch drains with LAB_DRAIN=1.
ring_needed: all nodes together missed their floor, more than two nodes took part and DIR has no ring-* result
yet: the caller measures the ring's pairs (a+b, b+c, ..., z+a) and calls lab validate again; a node in two slow
pairs is then the suspect.

>>> from lab.machine.health.validate_input import describe_pair
>>> describe_pair("cpu"), describe_pair("0,1"), describe_pair("0,1,2,3")
('two CPU processes', 'GPU pair 0,1', 'GPUs 0,1,2,3')
>>> parse_floors(["nodes=150", "b:node=1e3", "gpu_pair=300"])
{'': {'nodes': 150.0, 'pair': 300.0}, 'b': {'node': 1000.0}}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lab import atomic
from lab.errors import EXIT_FAILED, EXIT_OK, LabError
from lab.machine.health import baseline as fabric_baseline
from lab.machine.health import nccl_log_checks
from lab.machine.health.validate_input import (
    _folder,
    _result,
    _why_missing,
    judged_busbw,
    last_line,
    parse_expect,
    parse_floors,
    parse_nodes,
    wrong_elements,
)
from lab.machine.health.validate_node import Settings, node_record
from lab.verdict import FAILED, HELD

DEFINITIONS = {
    "busbw": "nccl-tests' bus bandwidth of all_reduce, algbw * 2 (n-1) / n, GB/s (1e9); per size the better of "
    "out-of-place and in-place",
    "judged": "the median busbw of the sizes >= 1 GiB (where inter-node bandwidth peaks); a run with no size that "
    "large is judged at its largest size, and says so in judged_at",
    "floor": "per node from its platform (lab.measure.platforms: a fraction of a cited healthy figure), replaced by "
    "--baseline FILE (--baseline-fraction of the recorded figure), replaced by --floor [NODE:]KEY=GBPS; "
    "a check across nodes takes the highest nodes floor among them",
    "host_device": "pinned host->device and device->host copies per GPU (lab bench hostdevice), GB/s (1e9)",
}


# ----------------------------------------------------------------------------- across nodes


def _across(
    folder: Path, stem: str, hosts: list[str], floor: float, source: str
) -> tuple[dict[str, Any] | None, str | None]:
    """(the check of one all-reduce across `hosts`, why there is none)."""
    doc, unreadable = _result(folder / f"{stem}.json")
    if doc is None:
        return None, (unreadable if unreadable else None)
    busbw, at = judged_busbw(doc)
    wrong = wrong_elements(doc)
    return {
        "hosts": hosts,
        "world_size": doc["world_size"],
        "avg_busbw": doc["avg_busbw"],
        "busbw": busbw,
        "judged_at": at,
        "floor": floor,
        "floor_source": source,
        "wrong": wrong,
        "ok": wrong == 0 and busbw >= floor,
    }, None


def _highest_nodes_floor(records: dict[str, Any], hosts: list[str]) -> tuple[float, str]:
    host = max(hosts, key=lambda h: records[h]["floors"]["nodes"])
    return records[host]["floors"]["nodes"], f"{host}: {records[host]['floor_sources']['nodes']}"


def ring_pairs(nodes: list[str]) -> list[tuple[str, str]]:
    """a+b, b+c, ..., z+a: each node in two pairs, so the node common to two slow pairs stands out."""
    return [(a, b) for a, b in zip(nodes, nodes[1:] + nodes[:1])]


def all_nodes_check(
    folder: Path, nodes: list[str], records: dict[str, Any], settings: Settings
) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any], list[str], list[str], bool]:
    """(all_nodes, runs[head]["nodes"], ring, suspects, problems, ring_needed)."""
    run = {
        "result": "nodes.json" if (folder / "nodes.json").exists() else None,
        "log": "nodes.log",
        "last_line": last_line(folder / "nodes.log"),
    }
    floor, source = _highest_nodes_floor(records, nodes)
    check, unreadable = _across(folder, "nodes", nodes, floor, source)
    if check is not None and settings.baseline is not None and not any("nodes" in f for f in settings.floors.values()):
        found = fabric_baseline.all_nodes_floor(settings.baseline, check["world_size"], settings.fraction)
        if found:
            check["floor"], check["floor_source"] = found
            check["ok"] = check["wrong"] == 0 and check["busbw"] >= check["floor"]
    if check is None:
        if len(nodes) == 1 and unreadable is None:
            return None, run, {}, [], [], False
        why = _why_missing(folder, "nodes", unreadable)
        return None, run, {}, [], [f"all nodes: the all-reduce did not complete: {nodes[0]}: {why}"], False
    ring: dict[str, Any] = {}
    for a, b in ring_pairs(nodes) if len(nodes) > 2 else []:
        pair_floor, pair_source = _highest_nodes_floor(records, [a, b])
        pair_check, pair_unreadable = _across(folder, f"ring-{a}_{b}", [a, b], pair_floor, pair_source)
        if pair_check is not None or pair_unreadable:
            ring[f"{a}+{b}"] = pair_check or {
                "hosts": [a, b],
                "world_size": None,
                "avg_busbw": None,
                "busbw": None,
                "floor": pair_floor,
                "wrong": 0,
                "ok": False,
                "error": pair_unreadable,
            }
    slow = [name for name, pair in ring.items() if not pair["ok"]]
    suspects = [node for node in nodes if sum(node in name.split("+") for name in slow) > 1]
    ring_needed = not check["ok"] and len(nodes) > 2 and not ring
    if check["ok"]:
        return check, run, ring, suspects, [], False
    said = f"; slow node: {', '.join(suspects)}" if suspects else (f"; slow pair: {', '.join(slow)}" if slow else "")
    if check["busbw"] < check["floor"]:
        problem = (
            f"all nodes: {check['world_size']} ranks: busbw {check['busbw']:.3g} GB/s, below "
            f"{check['floor']:g} GB/s, the highest floor among them"
            + (f" (and {check['wrong']} wrong elements)" if check["wrong"] else "")
            + said
        )
    else:
        problem = (
            f"all nodes: {check['world_size']} ranks: {check['wrong']} wrong elements "
            f"(busbw {check['busbw']:.3g} GB/s, floor {check['floor']:g} GB/s){said}"
        )
    return check, run, ring, suspects, [problem], ring_needed


def _nccl_log(folder: Path) -> dict[str, dict[str, Any]]:
    return nccl_log_checks.nccl_channels(nccl_log_checks.nccl_log(folder / "nodes.log"))


# ----------------------------------------------------------------------------- the verdict


def verdict(
    folder: str | Path, nodes: list[str], run_id: str, settings: Settings | None = None, runner: str = "slurm"
) -> dict[str, Any]:
    """validate.json's document for the results in `folder`: every node of `nodes` (a node that wrote nothing is
    reported too), all nodes together, the ring where it ran, the problems. Reads files, writes none."""
    folder = _folder(folder)
    settings = settings or Settings()
    if not nodes:
        raise LabError("--nodes: no nodes; name the nodes in order, e.g. --nodes dgx01,dgx02")
    unknown = sorted(set(settings.floors) - set(nodes) - {""}) + sorted(set(settings.expect) - set(nodes) - {""})
    if unknown:
        raise LabError(f"--floor/--expect {unknown[0]}:...: {unknown[0]!r} is not one of --nodes {','.join(nodes)}")
    results = [doc for name in nodes if (doc := _result(folder / f"node-{name}.json")[0])]
    like = results[0] if results else None
    channels = _nccl_log(folder)
    records, runs, problems = {}, {}, []
    for name in nodes:
        records[name], node_run, node_problems = node_record(folder, name, settings, like, channels, len(nodes) > 1)
        runs[name] = {"node": node_run}
        problems += node_problems
    check, head_run, ring, suspects, across_problems, ring_needed = all_nodes_check(folder, nodes, records, settings)
    runs[nodes[0]]["nodes"] = head_run
    problems += across_problems
    return {
        "check": "validate",
        "platform": runner,
        "run_id": run_id,
        "ok": not problems,
        "verdict": HELD if not problems else FAILED,  # lab.verdict's word for ok
        "problems": problems,
        "definitions": DEFINITIONS,
        "judged": DEFINITIONS["judged"],
        "nodes": records,
        "all_nodes": check,
        "ring": ring,
        "ring_needed": ring_needed,
        "suspects": suspects,
        "failed_nodes": failed_nodes(nodes, problems, suspects),
        "baseline": {"file": settings.baseline_file, "fraction": settings.fraction}
        if settings.baseline is not None
        else None,
        "runs": runs,
    }


def failed_nodes(nodes: list[str], problems: list[str], suspects: list[str]) -> dict[str, str]:
    """Each node that failed, with its first reason: what slurm/validate.sbatch drains (LAB_DRAIN=1).

    >>> failed_nodes(["a", "b"], ["b: xid: 2 XIDs", "b: pcie: x8", "all nodes: 120 GB/s"], ["a"])
    {'a': 'the slow node of the all-nodes ring', 'b': 'xid: 2 XIDs'}
    """
    failed = {}
    for node in nodes:
        own = [p.removeprefix(f"{node}: ") for p in problems if p.startswith(f"{node}: ")]
        if own:
            failed[node] = own[0]
        elif node in suspects:
            failed[node] = "the slow node of the all-nodes ring"
    return failed


FAILED_NODES_FILE = "failed-nodes.tsv"  # beside --out: NODE<TAB>first reason, a line each (empty when all passed)


def run(args: argparse.Namespace) -> int:
    """`lab validate`: write validate.json (and failed-nodes.tsv beside it), print each problem and the verdict;
    exit 0 passed, 1 failed."""
    nodes = parse_nodes(args.nodes)
    baseline = fabric_baseline.read(args.baseline) if args.baseline else None
    settings = Settings(
        parse_floors(args.floor),
        parse_expect(args.expect),
        baseline,
        args.baseline,
        fabric_baseline.parse_fraction(args.baseline_fraction),
        args.dcgm_level,
    )
    doc = verdict(args.folder, nodes, args.run_id, settings, args.runner)
    atomic.write_text(args.out, json.dumps(doc, indent=2) + "\n")
    failed = "".join(f"{node}\t{' '.join(reason.split())}\n" for node, reason in doc["failed_nodes"].items())
    atomic.write_text(Path(args.out).with_name(FAILED_NODES_FILE), failed)
    for problem in doc["problems"]:
        print(problem)
    if doc["ring_needed"]:
        print(
            f"validate: all nodes missed their floor; measure the ring's pairs "
            f"({', '.join(f'ring-{a}_{b}' for a, b in ring_pairs(nodes))}) and validate again to name the slow node"
        )
    if args.record_baseline and doc["ok"]:
        fabric_baseline.record(doc, args.record_baseline)
        print(f"validate: baseline written to {args.record_baseline}")
    elif args.record_baseline:
        print(
            f"validate: --record-baseline {args.record_baseline}: not written: a baseline is a healthy "
            f"cluster's figures and this run has problems (fix them, or waive them with --expect, and rerun)"
        )
    count = len(doc["problems"])
    outcome = doc["verdict"] if doc["ok"] else f"{doc['verdict']} ({count} problem{'s' if count > 1 else ''})"
    print(f"validate: {outcome}; every figure: {args.out}")
    return EXIT_OK if doc["ok"] else EXIT_FAILED
