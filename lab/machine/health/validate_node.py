"""One node of `lab validate`'s verdict: its platform from its facts, each fact's check, its floors (the platform's,
a baseline's or the operator's), and its own figures judged against them (lab.machine.health.node_figures: the
all-reduce over all its GPUs, the GPU pairs where they ran, its host<->device copies). lab.machine.health.validate
judges all nodes together and writes the verdict; the Settings (floors, expectations, baseline) come from its command
line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.machine.health import baseline as fabric_baseline
from lab.machine.health import fabric_checks, nccl_log_checks
from lab.machine.health import node_facts as nf
from lab.machine.health.node_facts import NOT_PRESENT, UNREADABLE
from lab.machine.health.node_figures import gpu_pairs, hostdevice, node_allreduce
from lab.machine.health.validate_input import FLOOR_KEYS, _result, last_line, on_gpus
from lab.measure import platforms as table
from lab.verdict import FAILED, NOT_APPLICABLE


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
    ) -> None:
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


def _platform(
    facts: dict[str, nf.Fact], like: dict[str, Any] | None
) -> tuple[table.Platform, str, list[dict[str, Any]], dict[str, Any]]:
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
    judged = _Judged()
    if not facts_dir.is_dir():
        judged.add(_no_facts(name, platform))
    judged.add(fabric_checks.gpus_seen(len(gpus), expect.get("gpus"), facts["driver-gpus"]))
    active_ib: list[dict[str, Any]] = []
    if platform.key != "cpu":
        active_ib = _link_checks(judged, name, facts, platform, gpus, expect, channels, multi_node)
        health = _health_checks(judged, facts, facts_dir, settings, expect)
    else:
        health = _health_without_gpus(facts)
        judged.checks.append(fabric_checks.check("gpu-checks", NOT_APPLICABLE, f"no NVIDIA GPU ({why})"))
    nvls_check, nvls = nccl_log_checks.nvls(
        nccl_log_checks.nccl_log(folder / f"node-{name}.log"), platform.node_ring_gbps is not None
    )
    if nvls_check is not None:
        judged.checks.append(nvls_check)
    floors, floor_sources = _floors(settings, name, platform, gpus, active_ib, nvls)

    problems = [f"{name}: {problem}" for problem in judged.problems]
    pairs = [node_allreduce(folder, name, doc, unreadable, like, floors, floor_sources, platform, problems)]
    pairs += gpu_pairs(folder, name, floors, floor_sources, problems)
    copies = hostdevice(folder, name, floors, floor_sources, platform, problems)
    record = {
        "gpus": len(gpus) if gpus else (0 if platform.key == "cpu" else None),
        "platform": {"key": platform.key, "name": platform.name, "why": why},
        "floors": floors,
        "floor_sources": floor_sources,
        "pairs": pairs,
        "hostdevice": copies,
        "facts": _parsed(facts, gpus, topo, active_ib),
        "checks": judged.checks,
        "health": health,
    }
    run = {
        "result": f"node-{name}.json" if doc else None,
        "log": f"node-{name}.log",
        "last_line": last_line(folder / f"node-{name}.log"),
    }
    return record, run, problems


@dataclass
class _Judged:
    """A node's fact checks in their order, and the problems of those that failed (node_record puts the node's name
    before each)."""

    checks: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, result: tuple[dict[str, str], list[str]]) -> None:
        self.checks.append(result[0])
        self.problems.extend(result[1])


def _no_facts(name: str, platform: table.Platform) -> tuple[dict[str, str], list[str]]:
    """A node without facts-NAME/: failed where it has GPUs (nothing of them was read), else not applicable."""
    gpu_node = platform.key != "cpu"
    found = fabric_checks.check("facts", FAILED if gpu_node else NOT_APPLICABLE, f"no facts-{name}/ in DIR")
    if not gpu_node:
        return found, []
    return found, [
        f"facts: no facts-{name}/ (scripts/node-facts.sh did not run on it): its GPUs, links and health are unchecked"
    ]


def _link_checks(
    judged: _Judged,
    name: str,
    facts: dict[str, nf.Fact],
    platform: table.Platform,
    gpus: list[dict[str, Any]],
    expect: dict[str, Any],
    channels: dict[str, dict[str, Any]],
    multi_node: bool,
) -> list[dict[str, Any]]:
    """A GPU node's links judged: PCIe, the NVSwitch fabric, InfiniBand, GPUDirect RDMA (and, across nodes, NCCL's
    use of it); its Active InfiniBand ports."""
    ib_want = _ib_expected(platform, expect)
    if facts["nvidia-smi-gpus"].ok:
        judged.add(fabric_checks.pcie(gpus, _pcie_expected(platform, expect)))
    else:
        judged.add(fabric_checks._missing("nvidia-smi", facts["nvidia-smi-gpus"]))
    if platform.nvswitch:
        driver = nf.query_fabric(facts["nvidia-smi-q"].text)["driver_version"] if facts["nvidia-smi-q"].ok else None
        judged.add(fabric_checks.fabric_manager(facts["fabricmanager"], driver))
        judged.add(fabric_checks.fabric_state(facts["nvidia-smi-q"]))
    ib_check, ib_problems, active_ib = fabric_checks.infiniband(facts["ibstat"], facts["ib-width"], ib_want)
    judged.add((ib_check, ib_problems))
    has_ib = bool(active_ib) or bool(ib_want and ib_want[0])
    if has_ib:
        judged.add(
            fabric_checks.gpudirect_support(
                facts["modules"], facts["kernel"], facts["driver-version"], facts["nvidia-smi-q"]
            )
        )
    if has_ib and multi_node and expect.get("gdrdma", "yes") == "yes":
        names = {name, name.split(".")[0], facts["hostname"].text.strip()} - {""}
        judged.add(nccl_log_checks.gdrdma(channels, names, "nodes.log"))
    return active_ib


def _health_checks(
    judged: _Judged, facts: dict[str, nf.Fact], facts_dir: Path, settings: Settings, expect: dict[str, Any]
) -> dict[str, Any]:
    """A GPU node's health judged: DCGM's diagnostic, the XIDs, row remaps; health's readings (with ECC's, reported
    only, and the DCGM level where there is one)."""
    level = settings.dcgm_level if settings.dcgm_level is not None else nf.dcgm_level(facts_dir)
    chk, problems, dcgm_diag = fabric_checks.dcgm(facts["dcgmi-diag"], level, expect.get("dcgm") == "skip")
    judged.add((chk, problems))
    chk, problems, xid_events = fabric_checks.xid(
        facts["journal-xid"],
        facts["journal-kernel-lines"],
        expect.get("xid_max", 0),
        expect.get("journal") == "skip",
        facts["dcgm-xid"],
    )
    judged.add((chk, problems))
    judged.add(fabric_checks.row_remap(facts["remapped-rows"]))
    health: dict[str, Any] = {
        "dcgm_diag": dcgm_diag,
        "xid_events": xid_events,
        "ecc_uncorrected": nf.ecc_rows(facts["ecc"].text) if facts["ecc"].ok else facts["ecc"].status,
    }
    if level:
        health["dcgm_level"] = level
    return health


def _health_without_gpus(facts: dict[str, nf.Fact]) -> dict[str, Any]:
    """A node without an NVIDIA GPU: health's readings, its XIDs counted where the journal is readable."""
    readable, _ = nf.journal_readable(facts["journal-xid"], facts["journal-kernel-lines"])
    xid_events = (
        len(nf.xids(facts["journal-xid"].text))
        if readable
        else (NOT_PRESENT if facts["journal-xid"].status == NOT_PRESENT else UNREADABLE)
    )
    return {"dcgm_diag": NOT_APPLICABLE, "xid_events": xid_events, "ecc_uncorrected": NOT_APPLICABLE}


def _floors(
    settings: Settings,
    name: str,
    platform: table.Platform,
    gpus: list[dict[str, Any]],
    active_ib: list[dict[str, Any]],
    nvls: bool | None,
) -> tuple[dict[str, float], dict[str, str]]:
    """(the node's floors, where each came from): its platform's for these GPUs, ports and NVLS, under a baseline's
    and --floor's (Settings.floor)."""
    defaults, sources = table.floors(platform, gpus, active_ib, nvls)
    floors: dict[str, float] = {}
    floor_sources: dict[str, str] = {}
    for key in FLOOR_KEYS:
        value, source = settings.floor(name, platform.key, key, defaults.get(key), sources.get(key, ""))
        if value is not None:
            floors[key], floor_sources[key] = value, source
    return floors, floor_sources


def _pcie_expected(platform: table.Platform, expect: dict[str, Any]) -> tuple[int, int] | None:
    """(generation, width) each GPU's link should have: --expect's over the platform's; None where neither says."""
    if not (platform.pcie or "pcie_gen" in expect or "pcie_width" in expect):
        return None
    return (
        expect.get("pcie_gen", (platform.pcie or (0, 0))[0]),
        expect.get("pcie_width", (platform.pcie or (0, 0))[1]),
    )


def _ib_expected(platform: table.Platform, expect: dict[str, Any]) -> tuple[int, float, str | None] | None:
    if platform.ib is None and not {"ib_ports", "ib_rate", "ib_width"} & expect.keys():
        return None
    count, rate, width = platform.ib or (0, 0.0, None)
    return expect.get("ib_ports", count), expect.get("ib_rate", rate), expect.get("ib_width", width)


def _parsed(
    facts: dict[str, nf.Fact], gpus: list[dict[str, Any]], topo: dict[str, Any], active_ib: list[dict[str, Any]]
) -> dict[str, Any]:
    """The facts as validate.json keeps them: parsed where parsed, how each was read (ok, not present, unreadable)."""
    query = nf.query_fabric(facts["nvidia-smi-q"].text) if facts["nvidia-smi-q"].ok else None
    return {
        "read": {name: fact.status for name, fact in facts.items()},
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
