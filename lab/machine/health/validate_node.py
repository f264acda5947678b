"""One node of `lab validate`'s verdict: its platform from its facts, each fact's check, its floors (the platform's,
a baseline's or the operator's), and its own figures judged against them: the all-reduce over all its GPUs, the
GPU pairs where they ran, its host<->device copies. lab.machine.health.validate judges all nodes together and writes the
verdict; the Settings (floors, expectations, baseline) come from its command line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lab.machine.health import baseline as fabric_baseline
from lab.machine.health import fabric_checks
from lab.machine.health import node_facts as nf
from lab.machine.health.status import NOT_APPLICABLE, NOT_PRESENT, UNREADABLE
from lab.machine.health.validate_input import (
    FLOOR_KEYS,
    _result,
    _shortfall,
    _why_missing,
    describe_pair,
    judged_busbw,
    last_line,
    on_gpus,
    wrong_elements,
)
from lab.measure import platforms as table


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

    nvls_check, nvls = fabric_checks.nvls(
        fabric_checks.nccl_log(folder / f"node-{name}.log"), platform.node_ring_gbps is not None
    )
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
