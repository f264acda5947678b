"""The checks `lab validate` makes of one node's facts (scripts/node-facts.sh, parsed by
lab.machine.health.node_facts), each a
record {name, verdict, detail} and, when it fails, a problem naming the node and the reason. A check whose tool is
not installed ("not present") or whose output cannot be read ("unreadable") failed: on a GPU node either is a
problem, never a pass (an operator who knowingly lacks the journal or DCGM says so with --expect journal=skip /
dcgm=skip, and the check is then not applicable, the waiver in its detail).

Verdicts are lab.verdict's, the doctor's too: held, failed, not run, not applicable (a CPU node's InfiniBand, a check
not asked for, a waived one, a figure reported but not judged).

GPUDirect RDMA needs nvidia_peermem or DMA-BUF (gpudirect_support): NVIDIA recommends DMA-BUF (GPU Operator docs,
"GPUDirect RDMA and GPUDirect Storage", docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/
gpu-operator-rdma.html): Linux 5.12 or later, driver 515 or later, the open GPU kernel modules. Whether NCCL used it
is read from NCCL's own log, with NVLS: lab.machine.health.nccl_log_checks.
"""

from __future__ import annotations

from typing import Any

from lab.machine.health import node_facts as nf
from lab.machine.health.fabric_manager import SERVICE, manager_state, start_advice
from lab.machine.health.node_facts import Fact
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, Check

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


def check(name: str, verdict: str, detail: str) -> dict[str, str]:
    """A check's record in validate.json (lab.verdict.Check's, as the doctor's lines)."""
    return Check(name, verdict, detail).record()


def _missing(name: str, fact: Fact, waiver: str = "") -> tuple[dict[str, str], list[str]]:
    """A check whose fact could not be had (its tool not present, its output unreadable): failed, and the problem
    that says so."""
    hint = f"; --expect {waiver}=skip waives it" if waiver else ""
    return check(name, FAILED, fact.why()), [f"{name}: {fact.why()}{hint}"]


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
        return check("gpus", HELD if seen else NOT_APPLICABLE, f"{seen} seen by the step"), []
    said = ", ".join(f"{count} in {source}" for source, count in has.items() if count)
    return check("gpus", FAILED, f"{seen} seen of {want}"), [
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
        return check("pcie", FAILED, "; ".join(problems)), [f"pcie: {problem}" for problem in problems]
    if notes:
        return check("pcie", HELD, "; ".join(notes)), []  # lowered while idle: judged by the copies
    link = f"Gen{expected[0]} x{expected[1]}" if expected else "its maximum"
    return check("pcie", HELD, f"{len(gpus)} GPU(s) at {link}"), []


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
        return check("fabric-state", FAILED, "nvidia-smi -q lists no GPU"), ["fabric-state: nvidia-smi -q lists no GPU"]
    if bad:
        return check("fabric-state", FAILED, "; ".join(bad)), [
            f"fabric-state: GPU fabric not completed ({'; '.join(bad)}): is nvidia-fabricmanager running?"
        ]
    return check("fabric-state", HELD, f"{len(gpus)} GPU(s): State Completed, Status Success"), []


def fabric_manager(fact: Fact, driver: str | None = None) -> tuple[dict[str, str], list[str]]:
    """`systemctl is-active nvidia-fabricmanager` as node-facts.sh recorded it (read as `lab doctor` reads it live,
    lab.machine.health.fabric_manager): "active", or the NVSwitch board's GPUs cannot use NVLink."""
    if fact.status == nf.NOT_PRESENT:
        return _missing("fabric-manager", fact)
    state = manager_state(fact.text)
    if state is None:
        return check("fabric-manager", FAILED, f"systemctl: {fact.text.strip()[:120] or 'no answer'}"), [
            f"fabric-manager: its state cannot be read from the node's record (systemctl: "
            f"{fact.text.strip()[:120] or 'no answer'}); run scripts/node-facts.sh on the host, not in a container"
        ]
    if state != "active":
        return check("fabric-manager", FAILED, f"{SERVICE} is {state}"), [
            f"fabric-manager: {SERVICE} is {state} on an NVSwitch system; {start_advice(driver)}"
        ]
    return check("fabric-manager", HELD, f"{SERVICE} is active"), []


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
                NOT_APPLICABLE,
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
            return (
                check("infiniband", FAILED, f"{ibstat.why()}; {ib_width.why()}"),
                [f"infiniband: {ibstat.why()}; {ib_width.why()}; {want[0]} port(s) expected"],
                [],
            )
        return check("infiniband", NOT_APPLICABLE, "no ibstat and no /sys/class/infiniband; none expected"), [], []
    if not want:
        return (
            check(
                "infiniband",
                HELD if active else NOT_APPLICABLE,
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
            return check("infiniband", HELD, f"{detail}; beyond them: {'; '.join(problems)}"), [], active
        return (
            check("infiniband", FAILED, f"{detail}; {'; '.join(problems) or 'no port'}"),
            [f"infiniband: {detail}: {'; '.join(problems) or 'no InfiniBand port found'}"],
            active,
        )
    return check("infiniband", HELD, detail), [], active


def gpudirect_support(modules: Fact, kernel: Fact, driver: Fact, query: Fact) -> tuple[dict[str, str], list[str]]:
    """nvidia_peermem loaded, or DMA-BUF possible (kernel >= 5.12, driver >= 515, the open kernel module where
    /proc/driver/nvidia/version says which)."""
    if modules.ok and "nvidia_peermem" in nf.module_names(modules.text):
        return check("gpudirect-support", HELD, "nvidia_peermem is loaded"), []
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
        return check("gpudirect-support", FAILED, f"{peermem}; DMA-BUF not possible: {'; '.join(reasons)}"), [
            f"gpudirect-support: {peermem} and DMA-BUF is not possible: {'; '.join(reasons)}"
        ]
    said = "" if module["open"] else " (open kernel module not confirmed: /proc/driver/nvidia/version unread)"
    return check(
        "gpudirect-support", HELD, f"DMA-BUF: kernel {kernel.text.strip()}, driver {version}{said}; {peermem}"
    ), []


def dcgm(fact: Fact, level: int | None, waived: bool) -> tuple[dict[str, str], list[str], str]:
    """(check, problems, the report's one-word reading) of dcgmi diag -r LEVEL."""
    if not level:
        return check("dcgm-diag", NOT_APPLICABLE, "not asked: no level (node-facts.sh OUTDIR 2)"), [], NOT_APPLICABLE
    name = f"dcgmi diag -r {level}"
    if not fact.ok and fact.status == nf.NOT_PRESENT:
        if waived:
            return check("dcgm-diag", NOT_APPLICABLE, f"{fact.why()} (waived: --expect dcgm=skip)"), [], NOT_APPLICABLE
        chk, problems = _missing(name, fact, "dcgm")
        return chk, problems, f"{FAILED}: {fact.why()}"
    parsed = nf.dcgm_diag(fact.text)
    if parsed["failed"] or fact.rc != 0:
        why = "; ".join(parsed["failed"]) or fact.why()
        return check("dcgm-diag", FAILED, why), [f"{name}: {why}"], f"{FAILED}: {why}"
    detail = f"{parsed['passed']} passed" + (f"; warnings: {'; '.join(parsed['warned'])}" if parsed["warned"] else "")
    return check("dcgm-diag", HELD, detail), [], HELD


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
            return check("xid", NOT_APPLICABLE, f"{why} (waived: --expect journal=skip)"), [], status
        return (
            check("xid", FAILED, why),
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
            check("xid", FAILED, f"{len(counted)} XID(s) {source}: {named}{besides}"),
            [f"xid: {len(counted)} XID(s) {source} (threshold {xid_max}): {named}{besides}"],
            len(counted),
        )
    return check("xid", HELD, f"{len(counted)} XID(s) {source} (threshold {xid_max}){besides}"), [], len(counted)


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
        return check("row-remap", FAILED, "; ".join(bad)), [
            f"row-remap: {'; '.join(bad)} (pending: reset the GPU; failure: the GPU needs service)"
        ]
    return check("row-remap", HELD, f"{len(rows)} GPU(s): no remap failure or pending"), []
