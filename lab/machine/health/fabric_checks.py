"""The checks `lab validate` makes of one node's facts (scripts/node-facts.sh, parsed by
lab.machine.health.node_facts), each a
record {name, status, detail} and, when it fails, a problem naming the node and the reason. A check whose tool is not
installed says "not present", one whose output cannot be read "unreadable": on a GPU node either is a problem, never
a pass (an operator who knowingly lacks the journal or DCGM says so with --expect journal=skip / dcgm=skip).

Statuses are lab.machine.health.status's, the doctor's too: ok, fail, not present, unreadable, not run (the check was
not
asked for), not applicable (a CPU node), note (reported, not judged: e.g. a GPU's PCIe generation lowered while idle).

GPUDirect RDMA is asserted from NCCL's own log (NCCL_DEBUG=INFO): a channel to another node over InfiniBand reads
"via NET/IB/<n>/GDRDMA" when the NIC reads and writes GPU memory directly, "via NET/IB/<n>" when it bounces through
host memory, "via NET/Socket" without InfiniBand at all. It needs nvidia_peermem or DMA-BUF: NVIDIA recommends DMA-BUF
(GPU Operator docs, "GPUDirect RDMA and GPUDirect Storage", docs.nvidia.com/datacenter/cloud-native/gpu-operator/
latest/gpu-operator-rdma.html): Linux 5.12 or later, driver 515 or later, the open GPU kernel modules; NCCL then
logs "GPU Direct RDMA (DMABUF) enabled" per HCA (nvidia-peermem: "GPU Direct RDMA (nvidia-peermem) enabled").

>>> nccl_channels("h1:1:2 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA")
{'h1': {'gdrdma': 1, 'ib': 0, 'socket': 0, 'dmabuf': False}}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lab.machine.health import node_facts as nf
from lab.machine.health.check import Check
from lab.machine.health.fabric_manager import SERVICE, manager_state, start_advice
from lab.machine.health.node_facts import Fact
from lab.machine.health.status import FAIL, NOT_APPLICABLE, NOT_PRESENT, NOT_RUN, NOTE, OK, UNREADABLE

DMABUF_DRIVER = (515,)
DMABUF_KERNEL = (5, 12)

# --expect KEY=VALUE: what a node should have, over its platform's table; "skip" waives a check's tool
EXPECT_KEYS = {
    "gpus": "GPUs the node has, which its step must see (an integer >= 0; slurm/validate.sbatch gives its Gres)",
    "xid_max": "XIDs since boot that still pass (an integer >= 0; default 0)",
    "ib_ports": "InfiniBand ports Active at the rate and width (an integer >= 0)",
    "ib_rate": "each port's rate in Gb/s (e.g. 400)",
    "ib_width": "each port's width (e.g. 4X)",
    "pcie_gen": "each GPU's PCIe generation (e.g. 5)",
    "pcie_width": "each GPU's PCIe width (e.g. 16)",
    "gdrdma": "yes (NCCL's log must show GPUDirect RDMA on InfiniBand; the default where there is InfiniBand) or no",
    "journal": "required (default: an unreadable journal is a problem) or skip",
    "dcgm": "required (default where a level is asked) or skip",
}


def check(name: str, status: str, detail: str) -> dict[str, str]:
    """A check's record in validate.json (lab.machine.health.check's, as the doctor's lines)."""
    return Check(name, status, detail).record()


def _missing(name: str, fact: Fact, waiver: str = "") -> tuple[dict[str, str], list[str]]:
    """A check whose fact could not be had: its status and the problem that says so."""
    hint = f"; --expect {waiver}=skip waives it" if waiver else ""
    return check(name, fact.status, fact.why()), [f"{name}: {fact.why()}{hint}"]


# ----------------------------------------------------------------------------- each check


def gpus_seen(seen: int, in_slurm: int | None, driver: Fact) -> tuple[dict[str, str], list[str]]:
    """The GPUs a node has against those its step saw. Slurm's Gres (--expect gpus=N, which slurm/validate.sbatch
    gives each node) and the driver's own list (/proc/driver/nvidia/gpus: procfs, listed even where the device
    files are hidden) say what it has; a step that saw fewer measured the node without them, and its figures would
    be judged on a smaller platform, down to a CPU's floor (a job that asked for no GPUs under ConstrainDevices, a
    container started without --gpus)."""
    bound = len(driver.text.split()) if driver.ok else 0
    has = {"Slurm's Gres": in_slurm or 0, "the driver's /proc/driver/nvidia/gpus": bound}
    want = max(has.values())
    if want <= seen:
        return check("gpus", OK if seen else NOT_APPLICABLE, f"{seen} seen by the step"), []
    said = ", ".join(f"{count} in {source}" for source, count in has.items() if count)
    return check("gpus", FAIL, f"{seen} seen of {want}"), [
        f"gpus: the node has {want} GPU(s) ({said}) but its step saw {seen}, so nothing of them was tested: ask the "
        f"job for them (sbatch --gpus-per-node={want}), or mend what hides them (ConstrainDevices, a container "
        f"without --gpus, a CPU build of torch)"
    ]


def pcie(gpus: list[dict[str, Any]], expected: tuple[int, int] | None) -> tuple[dict[str, str], list[str]]:
    """Each GPU's PCIe link: its width below its maximum, or its maximum below what the platform should have, fails.
    A generation below the maximum is a note only: the driver lowers it on an idle GPU (nvidia-smi
    --help-query-gpu: "These may be reduced when the GPU is not in use"); the pinned-copy bandwidth
    (hostdevice-NAME.json) judges the link under load."""
    problems, notes = [], []
    for gpu in gpus:
        gen, gen_max = gpu["pcie_gen_current"], gpu["pcie_gen_max"]
        width, width_max = gpu["pcie_width_current"], gpu["pcie_width_max"]
        where = f"GPU {gpu['index']}: PCIe Gen{gen} x{width} (max Gen{gen_max} x{width_max})"
        if width is not None and width_max is not None and width < width_max:
            problems.append(f"{where}: x{width} is below its maximum x{width_max} (a link trained down)")
        elif expected and ((gen_max or 0) < expected[0] or (width_max or 0) < expected[1]):
            problems.append(f"{where}: below the Gen{expected[0]} x{expected[1]} this platform's GPUs have")
        elif expected and (gen or 0) < expected[0]:
            notes.append(f"{where}: below Gen{expected[0]} now (idle GPUs lower it; judged by the copy bandwidth)")
    if problems:
        return check("pcie", FAIL, "; ".join(problems)), [f"pcie: {problem}" for problem in problems]
    if notes:
        return check("pcie", NOTE, "; ".join(notes)), []
    link = f"Gen{expected[0]} x{expected[1]}" if expected else "its maximum"
    return check("pcie", OK, f"{len(gpus)} GPU(s) at {link}"), []


def fabric_state(fact: Fact) -> tuple[dict[str, str], list[str]]:
    """nvidia-smi -q's Fabric State/Status per GPU: an NVSwitch GPU not "Completed"/"Success" has no NVLink fabric."""
    if not fact.ok:
        return _missing("fabric-state", fact)
    gpus = nf.query_fabric(fact.text)["gpus"]
    bad = [
        f"{gpu['bus_id']}: State {gpu['state']}, Status {gpu['status']}"
        for gpu in gpus
        if gpu["state"] != "Completed" or gpu["status"] != "Success"
    ]
    if not gpus:
        return check("fabric-state", UNREADABLE, "nvidia-smi -q lists no GPU"), [
            "fabric-state: nvidia-smi -q lists no GPU"
        ]
    if bad:
        return check("fabric-state", FAIL, "; ".join(bad)), [
            f"fabric-state: GPU fabric not completed ({'; '.join(bad)}): is nvidia-fabricmanager running?"
        ]
    return check("fabric-state", OK, f"{len(gpus)} GPU(s): State Completed, Status Success"), []


def fabric_manager(fact: Fact, driver: str | None = None) -> tuple[dict[str, str], list[str]]:
    """`systemctl is-active nvidia-fabricmanager` as node-facts.sh recorded it (read as `lab doctor` reads it live,
    lab.machine.health.fabric_manager): "active", or the NVSwitch board's GPUs cannot use NVLink."""
    if fact.status == NOT_PRESENT:
        return _missing("fabric-manager", fact)
    state = manager_state(fact.text)
    if state is None:
        return check("fabric-manager", UNREADABLE, f"systemctl: {fact.text.strip()[:120] or 'no answer'}"), [
            f"fabric-manager: its state cannot be read from the node's record (systemctl: "
            f"{fact.text.strip()[:120] or 'no answer'}); run scripts/node-facts.sh on the host, not in a container"
        ]
    if state != "active":
        return check("fabric-manager", FAIL, f"{SERVICE} is {state}"), [
            f"fabric-manager: {SERVICE} is {state} on an NVSwitch system; {start_advice(driver)}"
        ]
    return check("fabric-manager", OK, f"{SERVICE} is active"), []


def infiniband(
    ibstat: Fact, ib_width: Fact, want: tuple[int, float, str | None] | None
) -> tuple[dict[str, str], list[str], list[dict[str, Any]]]:
    """(check, problems, the Active InfiniBand ports): `want` (ports, Gb/s, width) Active at that rate and width, and
    every InfiniBand port below it named. With nothing expected the ports are reported only."""
    fabric = nf.transport(ibstat, ib_width)
    if fabric == "efa":  # AWS: no InfiniBand ports to judge; NCCL runs over aws-ofi-nccl, not NET/IB
        return (
            check(
                "infiniband",
                NOTE,
                "transport EFA (efa_N devices): port rates and GPUDirect RDMA from NCCL's log are not judged here; "
                "the all-nodes floor judges the fabric",
            ),
            [],
            [],
        )
    ports, source = nf.ib_ports(ibstat, ib_width, "ethernet" if fabric == "roce" else "infiniband")
    if fabric == "roce":  # RDMA over Converged Ethernet: the same verbs, judged the same way (NCCL logs NET/IB)
        source = f"RoCE, {source}"
    active = [port for port in ports if (port.get("state") or "").lower() == "active"]
    if not source:
        if want and want[0] > 0:
            fact = ib_width if ib_width.status != nf.NOT_PRESENT else ibstat
            return (
                check("infiniband", fact.status, f"{ibstat.why()}; {ib_width.why()}"),
                [f"infiniband: {ibstat.why()}; {ib_width.why()}; {want[0]} port(s) expected"],
                [],
            )
        return check("infiniband", NOT_PRESENT, "no ibstat and no /sys/class/infiniband"), [], []
    if not want:
        return (
            check(
                "infiniband",
                OK if active else NOT_APPLICABLE,
                f"{len(active)} Active InfiniBand port(s) ({source}); none expected by the platform",
            ),
            [],
            active,
        )
    count, rate, width = want

    def name(port: dict[str, Any]) -> str:
        return f"{port['ca']}/{port['port']}"

    good = [
        port
        for port in active
        if (port["rate_gbps"] or 0) >= rate and (width is None or port.get("width") in (None, width))
    ]
    problems = []
    for port in ports:
        if port in good:
            continue
        if port in active:
            problems.append(
                f"{name(port)} Active at {port['rate_gbps']:g} Gb/s {port.get('width') or ''}".rstrip()
                + f", expected {rate:g} Gb/s {width or ''}".rstrip()
            )
        else:
            problems.append(
                f"{name(port)} is {port.get('state') or 'in no known state'}"
                + (f" ({port['phys_state']})" if port.get("phys_state") else "")
            )
    detail = f"{len(good)} of {count} expected port(s) Active at {rate:g} Gb/s {width or ''}".rstrip() + f" ({source})"
    if len(good) < count or (problems and len(good) < len(ports)):
        if len(good) >= count:  # more ports than expected, some below: a storage rail is IB here; name, do not fail
            return check("infiniband", NOTE, f"{detail}; beyond them: {'; '.join(problems)}"), [], active
        return (
            check("infiniband", FAIL, f"{detail}; {'; '.join(problems) or 'no port'}"),
            [f"infiniband: {detail}: {'; '.join(problems) or 'no InfiniBand port found'}"],
            active,
        )
    return check("infiniband", OK, detail), [], active


def gpudirect_support(modules: Fact, kernel: Fact, driver: Fact, query: Fact) -> tuple[dict[str, str], list[str]]:
    """nvidia_peermem loaded, or DMA-BUF possible (kernel >= 5.12, driver >= 515, the open kernel module where
    /proc/driver/nvidia/version says which)."""
    if modules.ok and "nvidia_peermem" in nf.module_names(modules.text):
        return check("gpudirect-support", OK, "nvidia_peermem is loaded"), []
    kernel_version = nf.version_tuple(kernel.text) if kernel.ok else ()
    module = nf.driver_module(driver.text) if driver.ok else {"version": None, "open": None}
    version = module["version"] or (nf.query_fabric(query.text)["driver_version"] if query.ok else None)
    driver_version = nf.version_tuple(version or "")
    reasons = []
    if not kernel_version or kernel_version < DMABUF_KERNEL:
        reasons.append(f"kernel {kernel.text.strip() or 'unknown'} (DMA-BUF needs 5.12 or later)")
    if not driver_version or driver_version < DMABUF_DRIVER:
        reasons.append(f"driver {version or 'unknown'} (DMA-BUF needs 515 or later)")
    if module["open"] is False:
        reasons.append("the proprietary kernel module (DMA-BUF needs the open GPU kernel modules)")
    peermem = "nvidia_peermem is not loaded" if modules.ok else f"lsmod: {modules.status}"
    if reasons:
        return check("gpudirect-support", FAIL, f"{peermem}; DMA-BUF not possible: {'; '.join(reasons)}"), [
            f"gpudirect-support: {peermem} and DMA-BUF is not possible: {'; '.join(reasons)}"
        ]
    said = "" if module["open"] else " (open kernel module not confirmed: /proc/driver/nvidia/version unread)"
    return check(
        "gpudirect-support", OK, f"DMA-BUF: kernel {kernel.text.strip()}, driver {version}{said}; {peermem}"
    ), []


def dcgm(fact: Fact, level: int | None, waived: bool) -> tuple[dict[str, str], list[str], str]:
    """(check, problems, the report's one-word reading) of dcgmi diag -r LEVEL."""
    if not level:
        return check("dcgm-diag", NOT_RUN, "no level asked (node-facts.sh OUTDIR 2)"), [], NOT_RUN
    name = f"dcgmi diag -r {level}"
    if not fact.ok and fact.status == nf.NOT_PRESENT:
        if waived:
            return check("dcgm-diag", NOT_PRESENT, f"{fact.why()} (waived: --expect dcgm=skip)"), [], NOT_PRESENT
        chk, problems = _missing(name, fact, "dcgm")
        return chk, problems, NOT_PRESENT
    parsed = nf.dcgm_diag(fact.text)
    if parsed["failed"] or fact.rc != 0:
        why = "; ".join(parsed["failed"]) or fact.why()
        return check("dcgm-diag", FAIL, why), [f"{name}: {why}"], f"fail: {why}"
    detail = f"{parsed['passed']} passed" + (f"; warnings: {'; '.join(parsed['warned'])}" if parsed["warned"] else "")
    return check("dcgm-diag", OK, detail), [], "pass"


def xid(
    journal: Fact, kernel_lines: Fact, xid_max: int, waived: bool, dcgm: Fact | None = None
) -> tuple[dict[str, str], list[str], Any]:
    """(check, problems, the report's XID reading). The XIDs since boot from the kernel journal, or, where the journal
    cannot be read (an ordinary Slurm user has no journal rights), each GPU's last XID from DCGM, which needs none.
    XIDs an application causes (13, 31, 43, 45) are reported and not counted; more of the others than xid_max fail.
    With neither source the check says "unreadable" (and fails unless --expect journal=skip), never "0 XIDs"."""
    readable, why = nf.journal_readable(journal, kernel_lines)
    if readable:
        codes = [(event["code"], event["pci"]) for event in nf.xids(journal.text)]
        source = "since boot (the kernel journal)"
    elif dcgm is not None and dcgm.ok and (last := nf.dcgm_last_xids(dcgm.text)):
        codes = [(code, f"GPU {gpu}") for gpu, code in sorted(last.items()) if code]
        source = f"as each GPU's last (DCGM; the journal: {why})"
    else:
        status = nf.NOT_PRESENT if journal.status == nf.NOT_PRESENT else nf.UNREADABLE
        if waived:
            return check("xid", status, f"{why} (waived: --expect journal=skip)"), [], status
        return (
            check("xid", status, why),
            [
                f"xid: the kernel journal is {status}: {why}, and DCGM gave no XID field; --expect journal=skip "
                f"waives it"
            ],
            status,
        )
    counted = [(code, where) for code, where in codes if code not in nf.APPLICATION_XIDS]
    apart = len(codes) - len(counted)
    besides = f"; {apart} from applications (13, 31, 43, 45), not counted" if apart else ""
    if len(counted) > xid_max:
        named = ", ".join(sorted({f"Xid {code} on {where}" for code, where in counted}))
        return (
            check("xid", FAIL, f"{len(counted)} XID(s) {source}: {named}{besides}"),
            [f"xid: {len(counted)} XID(s) {source} (threshold {xid_max}): {named}{besides}"],
            len(counted),
        )
    return check("xid", OK, f"{len(counted)} XID(s) {source} (threshold {xid_max}){besides}"), [], len(counted)


def row_remap(fact: Fact) -> tuple[dict[str, str], list[str]]:
    """A row remap that failed, or one pending (until the GPU is reset), fails."""
    if not fact.ok:
        return _missing("row-remap", fact)
    rows = nf.remapped_rows(fact.text)
    bad = [
        f"{row['bus_id']}: "
        + ", ".join(word for word, flag in (("failure", row["failure"]), ("pending", row["pending"])) if flag)
        for row in rows
        if row["failure"] or row["pending"]
    ]
    if bad:
        return check("row-remap", FAIL, "; ".join(bad)), [
            f"row-remap: {'; '.join(bad)} (pending: reset the GPU; failure: the GPU needs service)"
        ]
    return check("row-remap", OK, f"{len(rows)} GPU(s): no remap failure or pending"), []


# ----------------------------------------------------------------------------- NCCL's log

NCCL_LOG_BYTES = 32 << 20  # an NCCL_DEBUG=INFO log of many nodes; its channel and NVLS lines come first


def nccl_log(path: Path) -> str:
    """The head of an NCCL_DEBUG=INFO log (NCCL_LOG_BYTES), or "" where it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(NCCL_LOG_BYTES).decode(errors="replace")
    except OSError:
        return ""


NCCL_INFO = re.compile(r"NCCL INFO ")
NVLS_COMM = re.compile(r"NCCL INFO NVLS comm ")  # src/transport/nvls.cc: NVLS set up for the communicator


def nvls(log: str, platform_has_nvls: bool) -> tuple[dict[str, str] | None, bool | None]:
    """(the check, whether NVLS ran) from NCCL's log of the node's all-reduce (NCCL_DEBUG=INFO): None where NCCL
    logged nothing at INFO (unknown: the node is judged at the NVLS figure), or where the platform has no NVLS.

    >>> nvls("h:1:1 [0] NCCL INFO NVLS comm 0x55 headRank 0 nHeads 8 buffSize 1048576", True)[1]
    True
    >>> nvls("h:1:1 [0] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7", True)[1]
    False
    """
    if not platform_has_nvls:
        return None, None
    if not NCCL_INFO.search(log):
        return check(
            "nvls", NOTE, "unknown: no NCCL_DEBUG=INFO lines in the node's log; judged at the NVLS figure"
        ), None
    if NVLS_COMM.search(log):
        return check("nvls", OK, "NCCL set up NVLS (NVLink SHARP) for the node's all-reduce"), True
    return (
        check(
            "nvls",
            NOTE,
            "NCCL did not set up NVLS for the node's all-reduce (NCCL_NVLS_ENABLE=0, or no multicast: the fabric "
            "manager, a container, the driver); judged at the ring's figure",
        ),
        False,
    )


# "via NET/IB/3/GDRDMA"; through another NIC of the node (PXN, NCCL's src/transport/net.cc) "via NET/IB/3(2)/GDRDMA"
CHANNEL = re.compile(
    r"^(?P<host>[^:\s]+):\d+:\d+ \[\d+\] NCCL INFO Channel .* via "
    r"NET/(?P<net>\w+)/\d+(?:\(\d+\))?(?P<gdr>/GDRDMA)?"
)
DMABUF = re.compile(r"^(?P<host>[^:\s]+):\d+:\d+ \[\d+\] NCCL INFO .*GPU Direct RDMA \(DMABUF\) enabled")


def nccl_channels(text: str) -> dict[str, dict[str, Any]]:
    """Per host of an NCCL_DEBUG=INFO log: its network channels over IB with GPUDirect RDMA, over IB without, over
    sockets, and whether NCCL registered GPU memory through DMA-BUF."""
    hosts: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if match := CHANNEL.match(line):
            seen = hosts.setdefault(match["host"], {"gdrdma": 0, "ib": 0, "socket": 0, "dmabuf": False})
            if match["net"].startswith("IB"):
                seen["gdrdma" if match["gdr"] else "ib"] += 1
            elif match["net"] == "Socket":
                seen["socket"] += 1
        elif match := DMABUF.match(line):
            hosts.setdefault(match["host"], {"gdrdma": 0, "ib": 0, "socket": 0, "dmabuf": False})["dmabuf"] = True
    return hosts


def gdrdma(channels: dict[str, dict[str, Any]], names: set[str], log_name: str) -> tuple[dict[str, str], list[str]]:
    """This node's channels in the log (its lines begin with one of `names`, its host names): all over IB with
    GDRDMA passes; any without, or over sockets, fails."""
    mine = [seen for host, seen in channels.items() if host in names or host.split(".")[0] in names]
    if not channels:
        return check("gdrdma", UNREADABLE, f"{log_name} has no NCCL INFO channel line (run it with NCCL_DEBUG=INFO)"), [
            f"gdrdma: {log_name} has no NCCL INFO channel line: GPUDirect RDMA not shown (NCCL_DEBUG=INFO)"
        ]
    if not mine:
        return check("gdrdma", NOT_RUN, f"{log_name} holds no line of this node (only the head's output)"), []
    total = {key: sum(seen[key] for seen in mine) for key in ("gdrdma", "ib", "socket")}
    how = " (DMA-BUF)" if any(seen["dmabuf"] for seen in mine) else ""
    if total["socket"] or total["ib"] or not total["gdrdma"]:
        said = (
            f"{total['socket']} channel(s) over sockets (NET/Socket)"
            if total["socket"]
            else f"{total['ib']} InfiniBand channel(s) without GDRDMA"
            if total["ib"]
            else "no network channel"
        )
        return check("gdrdma", FAIL, f"{said}; {total['gdrdma']} with GDRDMA{how}"), [
            f"gdrdma: GPUDirect RDMA not used: {log_name} shows {said} (nvidia_peermem or DMA-BUF, NCCL_NET_GDR_LEVEL)"
        ]
    return check("gdrdma", OK, f"{total['gdrdma']} InfiniBand channel(s), all via GDRDMA{how}"), []
