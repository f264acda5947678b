"""`lab validate DIR`: the fabric check's verdict. Each node's platform is picked from its facts (GPU model and count,
NVSwitch, InfiniBand; lab.health.platforms), every figure is judged against that platform's floors at the sizes that
matter, every fact against what the node should have (lab.health.fabric_checks), and all of it goes to validate.json,
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
             "checks": [{"name", "status", "detail"}], "health": {"dcgm_diag", "xid_events", "ecc_uncorrected"}}},
    "all_nodes": {"hosts", "world_size", "avg_busbw", "busbw", "judged_at", "floor", "wrong", "ok"} | null,
    "ring": {"A+B": {same keys as all_nodes}}, "ring_needed": bool, "suspects": [NAME], "failed_nodes": {NAME:
    its first reason}, "baseline": {"file", "fraction"} | null, "runs": {NAME: {"node": {"result", "log",
    "last_line"}, ["nodes": {...}]}}}
failed-nodes.tsv beside validate.json: NAME<TAB>its first reason, a line a failed node (empty when all passed):
what slurm/validate.sbatch drains with LAB_DRAIN=1.
ring_needed: all nodes together missed their floor, more than two nodes took part and DIR has no ring-* result
yet: the caller measures the ring's pairs (a+b, b+c, ..., z+a) and calls lab validate again; a node in two slow
pairs is then the suspect.

>>> describe_pair("cpu"), describe_pair("0,1"), describe_pair("0,1,2,3")
('two CPU processes', 'GPU pair 0,1', 'GPUs 0,1,2,3')
>>> parse_floors(["nodes=150", "b:node=1e3", "gpu_pair=300"])
{'': {'nodes': 150.0, 'pair': 300.0}, 'b': {'node': 1000.0}}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lab import atomic
from lab.errors import EXIT_FAILED, EXIT_OK, LabError
from lab.health import baseline as fabric_baseline
from lab.health import fabric_checks
from lab.health import node_facts as nf
from lab.health import platforms as table
from lab.health.status import NOT_APPLICABLE, NOT_PRESENT, UNREADABLE
from lab.health.validate_input import (
    FLOOR_KEYS,
    _folder,
    _result,
    _shortfall,
    _why_missing,
    describe_pair,
    judged_busbw,
    last_line,
    on_gpus,
    parse_expect,
    parse_floors,
    parse_nodes,
    wrong_elements,
)

NCCL_LOG_BYTES = 32 << 20  # an NCCL_DEBUG=INFO log of many nodes; its channel lines come first

DEFINITIONS = {
    "busbw": "nccl-tests' bus bandwidth of all_reduce, algbw * 2 (n-1) / n, GB/s (1e9); per size the better of "
    "out-of-place and in-place",
    "judged": "the median busbw of the sizes >= 1 GiB (where inter-node bandwidth peaks); a run with no size that "
    "large is judged at its largest size, and says so in judged_at",
    "floor": "per node from its platform (lab.health.platforms: a fraction of a cited healthy figure), replaced by "
    "--baseline FILE (--baseline-fraction of the recorded figure), replaced by --floor [NODE:]KEY=GBPS; "
    "a check across nodes takes the highest nodes floor among them",
    "host_device": "pinned host->device and device->host copies per GPU (lab bench hostdevice), GB/s (1e9)",
}


# ----------------------------------------------------------------------------- one node


class Settings:
    """What the command line asks beyond the folder: floors, expectations, the baseline."""

    def __init__(
        self,
        floors: dict[str, dict[str, float]] | None = None,
        expect: dict[str, dict[str, Any]] | None = None,
        baseline: dict[str, Any] | None = None,
        baseline_file: str | None = None,
        fraction: float = 0.8,
        dcgm_level: int | None = None,
    ):
        self.floors, self.expect = floors or {}, expect or {}
        self.baseline, self.baseline_file, self.fraction = baseline, baseline_file, fraction
        self.dcgm_level = dcgm_level

    def expected(self, node: str) -> dict[str, Any]:
        return {**self.expect.get("", {}), **self.expect.get(node, {})}

    def floor(self, node: str, platform: str, key: str, default: float | None, source: str) -> tuple[float | None, str]:
        """The floor of `key` for `node`: --floor NODE: over --floor over the baseline over the platform."""
        for scope, said in ((node, f"--floor {node}:{key}"), ("", f"--floor {key}")):
            if key in self.floors.get(scope, {}):
                return self.floors[scope][key], said
        if self.baseline is not None:
            found = fabric_baseline.floor_from(self.baseline, node, platform, key, self.fraction)
            if found:
                return found
        return default, source


def _text(path: Path) -> str:
    """A log's text, or "" where it is missing or unreadable."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _platform(facts: dict[str, nf.Fact], like: dict[str, Any] | None) -> tuple[table.Platform, str, list, dict]:
    """(platform, why, the GPUs, the topology) from the facts, or from the all-reduce result's device names when
    the facts say nothing of GPUs."""
    gpus = nf.gpu_rows(facts["nvidia-smi-gpus"].text) if facts["nvidia-smi-gpus"].ok else []
    topo = (
        nf.topo_links(facts["nvidia-smi-topo"].text)
        if facts["nvidia-smi-topo"].ok
        else {"gpus": 0, "pairs": {}, "all_nvlink": False, "min_nvlinks": None}
    )
    if not gpus and like is not None and on_gpus(like) and not facts["nvidia-smi-gpus"].ok:
        names = [name for name in like.get("devices") or [] if name != "cpu"]
        gpus = [
            {
                "index": i,
                "name": name,
                "pcie_gen_max": None,
                "pcie_width_max": None,
                "pcie_gen_current": None,
                "pcie_width_current": None,
            }
            for i, name in enumerate(names)
        ]
        platform, why = table.pick(gpus, all_nvlink=False)
        return platform, why + " (from the all-reduce's devices: no nvidia-smi facts)", gpus, topo
    platform, why = table.pick(gpus, topo["all_nvlink"])
    return platform, why, gpus, topo


def node_record(
    folder: Path,
    name: str,
    settings: Settings,
    like: dict[str, Any] | None,
    channels: dict[str, dict[str, Any]],
    multi_node: bool,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(nodes[name], runs[name]["node"], its problems). `like`: a node's result, for what a node that wrote none
    was asked to run (one job asks every node for the same)."""
    facts_dir = folder / f"facts-{name}"
    facts = nf.read_all(facts_dir)
    doc, unreadable = _result(folder / f"node-{name}.json")
    platform, why, gpus, topo = _platform(facts, doc or like)
    expect = settings.expected(name)
    active_ib: list[dict[str, Any]] = []
    checks: list[dict[str, str]] = []
    fact_problems: list[str] = []

    def add(result: tuple) -> None:
        checks.append(result[0])
        fact_problems.extend(result[1])

    health: dict[str, Any] = {
        "dcgm_diag": NOT_APPLICABLE,
        "xid_events": NOT_APPLICABLE,
        "ecc_uncorrected": NOT_APPLICABLE,
    }
    if not facts_dir.is_dir():
        checks.append(fabric_checks.check("facts", NOT_PRESENT, f"no facts-{name}/ in DIR"))
        if platform.key != "cpu":
            fact_problems.append(
                f"facts: no facts-{name}/ (scripts/node-facts.sh did not run on it): its GPUs, "
                f"links and health are unchecked"
            )
    add(fabric_checks.gpus_seen(len(gpus), expect.get("gpus"), facts["driver-gpus"]))
    if platform.key != "cpu":
        ib_want = _ib_expected(platform, expect)
        pcie_want = (
            (
                expect.get("pcie_gen", (platform.pcie or (0, 0))[0]),
                expect.get("pcie_width", (platform.pcie or (0, 0))[1]),
            )
            if platform.pcie or "pcie_gen" in expect or "pcie_width" in expect
            else None
        )
        if facts["nvidia-smi-gpus"].ok:
            add(fabric_checks.pcie(gpus, pcie_want))
        else:
            add(fabric_checks._missing("nvidia-smi", facts["nvidia-smi-gpus"]))
        if platform.nvswitch:
            driver = nf.query_fabric(facts["nvidia-smi-q"].text)["driver_version"] if facts["nvidia-smi-q"].ok else None
            add(fabric_checks.fabric_manager(facts["fabricmanager"], driver))
            add(fabric_checks.fabric_state(facts["nvidia-smi-q"]))
        ib_check, ib_problems, active_ib = fabric_checks.infiniband(facts["ibstat"], facts["ib-width"], ib_want)
        add((ib_check, ib_problems))
        has_ib = bool(active_ib) or bool(ib_want and ib_want[0])
        if has_ib:
            add(
                fabric_checks.gpudirect_support(
                    facts["modules"], facts["kernel"], facts["driver-version"], facts["nvidia-smi-q"]
                )
            )
        if has_ib and multi_node and expect.get("gdrdma", "yes") == "yes":
            names = {name, name.split(".")[0], facts["hostname"].text.strip()} - {""}
            add(fabric_checks.gdrdma(channels, names, "nodes.log"))
        level = settings.dcgm_level if settings.dcgm_level is not None else nf.dcgm_level(facts_dir)
        chk, problems, health["dcgm_diag"] = fabric_checks.dcgm(
            facts["dcgmi-diag"], level, expect.get("dcgm") == "skip"
        )
        add((chk, problems))
        chk, problems, health["xid_events"] = fabric_checks.xid(
            facts["journal-xid"],
            facts["journal-kernel-lines"],
            expect.get("xid_max", 0),
            expect.get("journal") == "skip",
            facts["dcgm-xid"],
        )
        add((chk, problems))
        add(fabric_checks.row_remap(facts["remapped-rows"]))
        health["ecc_uncorrected"] = nf.ecc_rows(facts["ecc"].text) if facts["ecc"].ok else facts["ecc"].status
        if level:
            health["dcgm_level"] = level
    else:
        readable, reason = nf.journal_readable(facts["journal-xid"], facts["journal-kernel-lines"])
        health["xid_events"] = (
            len(nf.xids(facts["journal-xid"].text))
            if readable
            else (NOT_PRESENT if facts["journal-xid"].status == NOT_PRESENT else UNREADABLE)
        )
        checks.append(fabric_checks.check("gpu-checks", NOT_APPLICABLE, f"no NVIDIA GPU ({why})"))

    nvls_check, nvls = fabric_checks.nvls(_text(folder / f"node-{name}.log"), platform.node_ring_gbps is not None)
    if nvls_check is not None:
        checks.append(nvls_check)
    defaults, sources = table.floors(platform, gpus, active_ib, nvls)
    floors: dict[str, float] = {}
    floor_sources: dict[str, str] = {}
    for key in FLOOR_KEYS:
        value, source = settings.floor(name, platform.key, key, defaults.get(key), sources.get(key, ""))
        if value is not None:
            floors[key], floor_sources[key] = value, source

    problems = [f"{name}: {problem}" for problem in fact_problems]
    pairs = [_node_allreduce(folder, name, doc, unreadable, like, floors, floor_sources, platform, problems)]
    pairs += _pairs(folder, name, floors, floor_sources, problems)
    hostdevice = _hostdevice(folder, name, floors, floor_sources, platform, problems)
    record = {
        "gpus": len(gpus) if gpus else (0 if platform.key == "cpu" else None),
        "platform": {"key": platform.key, "name": platform.name, "why": why},
        "floors": floors,
        "floor_sources": floor_sources,
        "pairs": pairs,
        "hostdevice": hostdevice,
        "facts": _parsed(facts, gpus, topo, active_ib),
        "checks": checks,
        "health": health,
    }
    run = {
        "result": f"node-{name}.json" if doc else None,
        "log": f"node-{name}.log",
        "last_line": last_line(folder / f"node-{name}.log"),
    }
    return record, run, problems


def _ib_expected(platform: table.Platform, expect: dict[str, Any]) -> tuple[int, float, str | None] | None:
    if platform.ib is None and not {"ib_ports", "ib_rate", "ib_width"} & expect.keys():
        return None
    count, rate, width = platform.ib or (0, 0.0, None)
    return expect.get("ib_ports", count), expect.get("ib_rate", rate), expect.get("ib_width", width)


def _node_allreduce(
    folder: Path,
    name: str,
    doc: dict[str, Any] | None,
    unreadable: str | None,
    like: dict[str, Any] | None,
    floors: dict[str, float],
    sources: dict[str, str],
    platform: table.Platform,
    problems: list[str],
) -> dict[str, Any]:
    """The node's all-reduce over all its GPUs (or two CPU processes) against its node floor."""
    shape = doc or like
    gpus = (shape["world_size"] if on_gpus(shape) else 0) if shape else None
    pair = ("cpu" if gpus == 0 else ",".join(map(str, range(gpus)))) if gpus is not None else "all"
    key = "pair" if pair == "cpu" else "node"
    entry: dict[str, Any] = {
        "pair": pair,
        "rc": None,
        "avg_busbw": None,
        "busbw": None,
        "judged_at": None,
        "floor": floors[key],
        "ok": False,
        "error": None,
    }
    what = f"{name}: all-reduce of {describe_pair(pair)}"
    if doc is None:
        entry["error"] = _why_missing(folder, f"node-{name}", unreadable)
        problems.append(f"{what}: no result: {entry['error']}")
        return entry
    busbw, at = judged_busbw(doc)
    wrong = wrong_elements(doc)
    entry.update(
        avg_busbw=doc["avg_busbw"], busbw=busbw, judged_at=at, wrong=wrong, ok=wrong == 0 and busbw >= floors[key]
    )
    if not entry["ok"]:
        hint = " (NVLS off, an NVLink down or the fabric manager?)" if platform.nvswitch and busbw < floors[key] else ""
        problems.append(f"{what}: {_shortfall(busbw, floors[key], wrong, sources[key])}{hint}")
    return entry


PAIR_FILE = re.compile(r"^pair-(?P<node>.+)-(?P<i>\d+)-(?P<j>\d+)\.json$")


def _pairs(
    folder: Path, name: str, floors: dict[str, float], sources: dict[str, str], problems: list[str]
) -> list[dict[str, Any]]:
    """The node's GPU pairs, where they were run (pair-NAME-I-J.json)."""
    entries = []
    found = sorted(
        (int(m["i"]), int(m["j"]), path)
        for path in folder.glob(f"pair-{name}-*-*.json")
        if (m := PAIR_FILE.match(path.name)) and m["node"] == name
    )
    for i, j, path in found:
        doc, unreadable = _result(path)
        pair = f"{i},{j}"
        entry: dict[str, Any] = {
            "pair": pair,
            "rc": None,
            "avg_busbw": None,
            "busbw": None,
            "judged_at": None,
            "floor": floors["pair"],
            "ok": False,
            "error": unreadable,
        }
        if doc is None:
            problems.append(f"{name}: all-reduce of GPU pair {pair}: no result: {unreadable}")
        else:
            busbw, at = judged_busbw(doc)
            wrong = wrong_elements(doc)
            entry.update(
                avg_busbw=doc["avg_busbw"],
                busbw=busbw,
                judged_at=at,
                wrong=wrong,
                ok=wrong == 0 and busbw >= floors["pair"],
            )
            if not entry["ok"]:
                problems.append(
                    f"{name}: all-reduce of GPU pair {pair}: "
                    f"{_shortfall(busbw, floors['pair'], wrong, sources['pair'])}"
                )
        entries.append(entry)
    return entries


def _hostdevice(
    folder: Path,
    name: str,
    floors: dict[str, float],
    sources: dict[str, str],
    platform: table.Platform,
    problems: list[str],
) -> dict[str, Any] | None:
    """hostdevice-NAME.json (lab bench hostdevice): each GPU's pinned copies against host_device, the
    device-to-device copies against d2d where a floor is set."""
    stem = f"hostdevice-{name}"
    doc, unreadable = _result(folder / f"{stem}.json", ("gpus", "d2d_gbps"), "`lab bench hostdevice --json`")
    if doc is None:
        if unreadable or (folder / f"{stem}.log").exists():
            why = _why_missing(folder, stem, unreadable)
            problems.append(f"{name}: host<->device copies: no result: {why}")
            return {"ok": False, "error": why}
        return None
    if doc.get("device") == "cpu" or platform.key == "cpu":
        return {"ok": True, "device": "cpu", "min_gbps": None, "note": "CPU copies: not judged"}
    floor = floors.get("host_device")
    low = []
    figures = [value for gpu in doc["gpus"] for value in (gpu.get("h2d_gbps"), gpu.get("d2h_gbps")) if value]
    for gpu in doc["gpus"]:
        for direction in ("h2d", "d2h"):
            value = gpu.get(f"{direction}_gbps")
            if floor is not None and (value is None or value < floor):
                low.append(f"GPU {gpu['index']} {direction} {value if value is None else f'{value:.3g}'} GB/s")
    if low:
        problems.append(
            f"{name}: host<->device copies below their floor {floor:g} GB/s: {', '.join(low)} "
            f"(a PCIe link trained down?)"
        )
    d2d_low = []
    if "d2d" in floors:
        for i, row in enumerate(doc["d2d_gbps"]):
            d2d_low += [f"{i}->{j} {value:.3g} GB/s" for j, value in enumerate(row) if i != j and value < floors["d2d"]]
        if d2d_low:
            problems.append(
                f"{name}: device-to-device copies below their floor {floors['d2d']:g} GB/s: {', '.join(d2d_low)}"
            )
    return {
        "ok": not low and not d2d_low,
        "method": doc.get("method"),
        "device": doc.get("device"),
        "min_gbps": min(figures) if figures else None,
        "floor": floor,
        "below": low + d2d_low,
        "gpus": doc["gpus"],
        "d2d_gbps": doc["d2d_gbps"],
    }


def _parsed(facts: dict[str, nf.Fact], gpus: list, topo: dict, active_ib: list) -> dict[str, Any]:
    """The facts as validate.json keeps them: parsed where parsed, each fact's status."""
    query = nf.query_fabric(facts["nvidia-smi-q"].text) if facts["nvidia-smi-q"].ok else None
    return {
        "status": {name: fact.status for name, fact in facts.items()},
        "hostname": facts["hostname"].text.strip() if facts["hostname"].ok else None,
        "kernel": facts["kernel"].text.strip() if facts["kernel"].ok else None,
        "driver_version": query["driver_version"] if query else None,
        "gpus": gpus,
        "nvlink_all_pairs": topo["all_nvlink"],
        "min_nvlinks": topo["min_nvlinks"],
        "fabric": query["gpus"] if query else None,
        "infiniband_active": active_ib,
        "nvidia_peermem": "nvidia_peermem" in nf.module_names(facts["modules"].text) if facts["modules"].ok else None,
        "fabric_manager": facts["fabricmanager"].text.strip() or None,
        "dcgm_version": facts["dcgmi-version"].text.strip().splitlines()[0][:200]
        if facts["dcgmi-version"].ok and facts["dcgmi-version"].text.strip()
        else None,
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
    path = folder / "nodes.log"
    if not path.exists():
        return {}
    with open(path, "rb") as f:
        return fabric_checks.nccl_channels(f.read(NCCL_LOG_BYTES).decode(errors="replace"))


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


def run(args) -> int:
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
    outcome = "passed" if doc["ok"] else f"FAILED ({count} problem{'s' if count > 1 else ''})"
    print(f"validate: {outcome}; every figure: {args.out}")
    return EXIT_OK if doc["ok"] else EXIT_FAILED
