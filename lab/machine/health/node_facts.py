"""What scripts/node-facts.sh wrote for one node, parsed: its GPUs and their PCIe links, NVLink topology, GPU fabric
state, row remaps, ECC, InfiniBand ports, kernel modules, the fabric manager, DCGM's diagnostic and the XIDs of the
kernel journal. Parsing only: lab.machine.health.fabric_checks judges.

Every fact is read from FOLDER/NAME.txt and FOLDER/NAME.rc. A fact is "not present" when its tool is not installed
(rc 127) or the folder has no such file, "unreadable" when the tool ran and failed, so a judge never takes a missing
answer for a healthy one.

>>> gpu_rows("0, NVIDIA H100 80GB HBM3, GPU-1, 81559, 5, 5, 16, 16\\n")[0]["pcie_width_max"]
16
>>> ib_width_rows("mlx5_0 port 1: state=4: ACTIVE; phys_state=5: LinkUp; rate=400 Gb/sec (4X NDR); "
...               "link_layer=InfiniBand")[0]["width"]
'4X'
>>> version_tuple("550.54.15"), version_tuple("5.15.0-105-generic")
((550, 54, 15), (5, 15, 0))
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# How a fact was read, not a verdict (lab.verdict's words judge the checks made of the facts):
OK = "ok"  # its tool ran and left its output
NOT_PRESENT = "not present"  # its tool is not installed (exit 127) or the script left no file
UNREADABLE = "unreadable"  # its tool failed, or its file cannot be read

FACT_TAIL_BYTES = 1 << 20  # a DCGM level-3 log or a long journal is not read whole
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # a terminal's colours and underlines: what no parser should meet


@dataclass(frozen=True)
class Fact:
    """One fact as the script left it: its text, exit status and what that means ("ok", "not present",
    "unreadable")."""

    name: str
    text: str
    rc: int | None
    status: str

    @property
    def ok(self) -> bool:
        return self.status == OK

    def why(self) -> str:
        """The fact's state in a problem's words: "ibstat: not present (ibstat: not installed)"."""
        first = next((line.strip() for line in self.text.splitlines() if line.strip()), "no output")
        return f"{self.name}: {self.status}" + ("" if self.ok else f" ({first[:160]})")


def read_fact(folder: Path, name: str) -> Fact:
    txt, rc_file = folder / f"{name}.txt", folder / f"{name}.rc"
    if not txt.exists():
        return Fact(name, f"no {name}.txt in {folder.name}", None, NOT_PRESENT)
    try:
        with open(txt, "rb") as f:
            text = f.read(FACT_TAIL_BYTES).decode(errors="replace")
        rc = int(rc_file.read_text().strip()) if rc_file.exists() else None
    except (OSError, ValueError) as exc:
        return Fact(name, f"{exc}", None, UNREADABLE)
    text = ANSI.sub("", text)  # some nvidia-smi versions underline a header even into a file: \x1b[4mGPU0 ...
    if rc == 127:
        return Fact(name, text, rc, NOT_PRESENT)
    return Fact(name, text, rc, OK if rc == 0 else UNREADABLE)


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading dotted numbers of a version ("5.15.0-105-generic" -> (5, 15, 0)); () when there are none."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


# ----------------------------------------------------------------------------- nvidia-smi


def gpu_rows(text: str) -> list[dict[str, Any]]:
    """nvidia-smi --query-gpu=index,name,uuid,memory.total,pcie.link.gen.current,pcie.link.gen.max,
    pcie.link.width.current,pcie.link.width.max --format=csv,noheader,nounits: one dict per GPU."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 8 or _int(cells[0]) is None:
            continue
        rows.append(
            {
                "index": int(cells[0]),
                "name": cells[1],
                "uuid": cells[2],
                "memory_mib": _int(cells[3]),
                "pcie_gen_current": _int(cells[4]),
                "pcie_gen_max": _int(cells[5]),
                "pcie_width_current": _int(cells[6]),
                "pcie_width_max": _int(cells[7]),
            }
        )
    return rows


def query_fabric(text: str) -> dict[str, Any]:
    """nvidia-smi -q: the driver version and, per GPU, its "Fabric" section's State and Status (NVSwitch systems:
    "Completed" / "Success" once the fabric manager has trained the GPU's NVLinks; "N/A" elsewhere)."""
    driver = re.search(r"^\s*Driver Version\s*:\s*(\S+)", text, re.M)
    gpus, current, in_fabric = [], None, False
    for line in text.splitlines():
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", line):
            current = {"bus_id": line.split()[1], "state": None, "status": None}
            gpus.append(current)
            in_fabric = False
            continue
        indent = len(line) - len(line.lstrip())
        if current is not None and line.strip() == "Fabric":
            in_fabric, fabric_indent = True, indent
            continue
        if in_fabric and line.strip() and indent <= fabric_indent:
            in_fabric = False
        if in_fabric and ":" in line:
            assert current is not None  # in_fabric is only set inside a GPU's section
            key, _, value = (part.strip() for part in line.partition(":"))
            if key in ("State", "Status") and current[key.lower()] is None:
                current[key.lower()] = value
    return {"driver_version": driver.group(1) if driver else None, "gpus": gpus}


def topo_links(text: str) -> dict[str, Any]:
    """nvidia-smi topo -m: each GPU pair's connection ("NV18", "SYS", "PIX", ...). On an NVSwitch board every pair
    shows NV#: each GPU's links go to the switches, so NVLink joins every pair at once."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        return {"gpus": 0, "pairs": {}, "all_nvlink": False, "min_nvlinks": None}
    gpus = [name for name in header if re.fullmatch(r"GPU\d+", name)]
    pairs: dict[str, str] = {}
    for line in lines:
        cells = line.split()
        if not cells or cells[0] not in gpus or cells[0] == line.strip():
            continue
        for column, link in zip(gpus, cells[1 : 1 + len(gpus)]):
            i, j = int(cells[0][3:]), int(column[3:])
            if i < j:
                pairs[f"{i},{j}"] = link
    nv = [int(link[2:]) for link in pairs.values() if re.fullmatch(r"NV\d+", link)]
    all_nvlink = bool(pairs) and len(nv) == len(pairs)
    return {"gpus": len(gpus), "pairs": pairs, "all_nvlink": all_nvlink, "min_nvlinks": min(nv) if nv else None}


def remapped_rows(text: str) -> list[dict[str, Any]]:
    """nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,
    remapped_rows.pending,remapped_rows.failure --format=csv,noheader (pending/failure: "Yes"/"No", or 0/1)."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 5 or not re.match(r"[0-9A-Fa-f]{4,8}:", cells[0]):
            continue

        def flag(value: str) -> bool | None:
            return {"yes": True, "1": True, "no": False, "0": False}.get(value.lower())

        rows.append(
            {
                "bus_id": cells[0],
                "correctable": _int(cells[1]),
                "uncorrectable": _int(cells[2]),
                "pending": flag(cells[3]),
                "failure": flag(cells[4]),
            }
        )
    return rows


def ecc_rows(text: str) -> dict[str, str]:
    """nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total: GPU index -> count (or "[N/A]")."""
    return {
        cells[0]: cells[1]
        for line in text.splitlines()
        if len(cells := [cell.strip() for cell in line.split(",")]) == 2 and cells[0].isdigit()
    }


# ----------------------------------------------------------------------------- InfiniBand


def ibstat_ports(text: str) -> list[dict[str, Any]]:
    """ibstat: per CA and port its State, Physical state, Rate (Gb/s) and Link layer."""
    ports, ca, port = [], None, None
    for line in text.splitlines():
        if match := re.match(r"^CA '([^']+)'", line):
            ca, port = match.group(1), None
            continue
        if match := re.match(r"^\s*Port (\d+):\s*$", line):
            port = {
                "ca": ca,
                "port": int(match.group(1)),
                "state": None,
                "phys_state": None,
                "rate_gbps": None,
                "link_layer": None,
            }
            ports.append(port)
            continue
        if port is not None and ":" in line:
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "State":
                port["state"] = value
            elif key == "Physical state":
                port["phys_state"] = value
            elif key == "Rate":
                port["rate_gbps"] = float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else None
            elif key == "Link layer":
                port["link_layer"] = value
    return ports


def ib_width_rows(text: str) -> list[dict[str, Any]]:
    """node-facts.sh's ib-width lines (sysfs): device, port, state, rate (Gb/s), width ("4X"), link layer."""
    rows = []
    for line in text.splitlines():
        match = re.match(r"^(\S+) port (\d+): (.*)$", line.strip())
        if not match:
            continue
        fields = dict(part.strip().partition("=")[::2] for part in match.group(3).split(";"))
        rate = re.match(r"\s*(\d+(?:\.\d+)?) Gb/sec(?: \((\d+X)(?: (\w+))?\))?", fields.get("rate", ""))
        state = fields.get("state", "")
        rows.append(
            {
                "ca": match.group(1),
                "port": int(match.group(2)),
                "state": state.split(":", 1)[-1].strip().capitalize() if state else None,
                "rate_gbps": float(rate.group(1)) if rate else None,
                "width": rate.group(2) if rate else None,
                "speed": rate.group(3) if rate else None,
                "link_layer": fields.get("link_layer") or None,
            }
        )
    return rows


def ib_ports(ibstat: Fact, ib_width: Fact, link_layer: str = "infiniband") -> tuple[list[dict[str, Any]], str]:
    """Every RDMA port of one link layer ("infiniband"; "ethernet": RoCE, storage) with state, rate and width,
    merged from ibstat and sysfs (sysfs has the width; either alone serves), and where they came from."""
    by_port: dict[tuple[str, int], dict[str, Any]] = {}
    sources = []
    for fact, rows in ((ib_width, ib_width_rows), (ibstat, ibstat_ports)):
        if not fact.ok:
            continue
        sources.append(fact.name)
        for row in rows(fact.text):
            merged = by_port.setdefault((row["ca"], row["port"]), {"width": None})
            for key, value in row.items():
                if merged.get(key) is None:
                    merged[key] = value
    ports = [port for port in by_port.values() if (port.get("link_layer") or "").lower() == link_layer]
    return sorted(ports, key=lambda p: (p["ca"], p["port"])), " and ".join(sources)


def transport(ibstat: Fact, ib_width: Fact) -> str:
    """The node's RDMA fabric by its ports' link layer: "infiniband", "roce" (RDMA ports on Ethernet only:
    Spectrum-X, RoCE clusters), "efa" (AWS's Elastic Fabric Adapter devices, efa_N), or "none"."""
    infiniband, _ = ib_ports(ibstat, ib_width)
    if infiniband:
        return "infiniband"
    every = [
        row for fact, rows in ((ib_width, ib_width_rows), (ibstat, ibstat_ports)) if fact.ok for row in rows(fact.text)
    ]
    if any(str(row["ca"]).startswith("efa") for row in every):
        return "efa"
    return "roce" if ib_ports(ibstat, ib_width, "ethernet")[0] else "none"


# ----------------------------------------------------------------------------- the rest


def module_names(text: str) -> set[str]:
    """lsmod: the loaded modules' names (its first column, without the header)."""
    return {line.split()[0] for line in text.splitlines()[1:] if line.split()}


def dcgm_diag(text: str) -> dict[str, Any]:
    """dcgmi diag's table (DCGM 3 and 4): the tests that failed or warned, and how many passed."""
    failed, warned, passed, test = [], [], 0, None
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|+").split("|")]
        if len(cells) != 2 or cells[0].startswith("-"):
            continue
        name, result = cells
        test = name or test
        word = result.split(" ")[0].rstrip(":").lower()
        if re.match(r"gpu\d+:", result.lower()):
            word = result.split(":", 1)[1].strip().split(" ")[0].lower()
        if word == "fail":
            failed.append(f"{test}: {result}")
        elif word == "warn":
            warned.append(f"{test}: {result}")
        elif word == "pass":
            passed += 1
    return {"failed": failed, "warned": warned, "passed": passed}


XID_LINE = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")


def xids(text: str) -> list[dict[str, Any]]:
    """The journal's "NVRM: Xid (PCI:0000:18:00): 79, ..." lines: which GPU, which code."""
    return [{"pci": match.group(1), "code": int(match.group(2))} for match in XID_LINE.finditer(text)]


# XIDs that an application causes (a faulting kernel, a killed process), not the GPU: 13 graphics engine exception,
# 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup (NVIDIA's XID catalog; the lab's
# LabGpuXidError alert says the same). Reported, not counted against a node.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
DCGM_XID_ROW = re.compile(r"^\s*GPU\s+(\d+)\s+(\d+)\s*$", re.MULTILINE)


def dcgm_last_xids(text: str) -> dict[int, int]:
    r"""`dcgmi dmon -e 230 -c 1`: each GPU's last XID (0: none since the driver loaded).

    >>> dcgm_last_xids("#Entity   XID\nID\nGPU 0     0\nGPU 1     79\n")
    {0: 0, 1: 79}
    """
    return {int(gpu): int(code) for gpu, code in DCGM_XID_ROW.findall(text)}


JOURNAL_DENIED = ("insufficient permissions", "not seeing messages", "no journal files", "permission denied")


def journal_readable(xid: Fact, kernel_lines: Fact) -> tuple[bool, str]:
    """(whether the journal's kernel messages of this boot could be read, why not). journalctl without the rights
    prints nothing with -q and exits 0: the count of kernel lines read (a booted kernel always logged some) and any
    permission message tell it apart from a journal without XIDs."""
    if not xid.ok:
        return False, xid.why()
    text = (xid.text + "\n" + kernel_lines.text).lower()
    if denied := next((phrase for phrase in JOURNAL_DENIED if phrase in text), None):
        return False, f"journalctl says {denied!r}"
    if kernel_lines.ok:
        count = _int(kernel_lines.text.splitlines()[0] if kernel_lines.text.strip() else "")
        if not count:
            return False, "journalctl read no kernel message of this boot (no journal rights, or no journal)"
    elif kernel_lines.status == UNREADABLE:
        return False, kernel_lines.why()
    return True, ""


def driver_module(text: str) -> dict[str, Any]:
    """/proc/driver/nvidia/version: the driver version and whether it is the open kernel module."""
    version = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return {"version": version.group(1) if version else None, "open": "Open Kernel Module" in text}


FACT_NAMES = (
    "hostname",
    "kernel",
    "driver-gpus",
    "nvidia-smi-gpus",
    "nvidia-smi-q",
    "nvidia-smi-topo",
    "remapped-rows",
    "ecc",
    "ibstat",
    "ib-width",
    "modules",
    "fabricmanager",
    "dcgmi-version",
    "dcgm-xid",
    "dcgmi-diag",
    "journal-xid",
    "journal-kernel-lines",
    "driver-version",
    "nvswitch",
)


def read_all(folder: Path) -> dict[str, Fact]:
    """Every fact of FOLDER (facts-NAME/), by name; an absent folder gives every fact "not present"."""
    return {name: read_fact(folder, name) for name in FACT_NAMES}


def dcgm_level(folder: Path) -> int | None:
    """The level node-facts.sh was asked for (dcgm-level.txt), None when it is not written."""
    try:
        return _int((folder / "dcgm-level.txt").read_text())
    except OSError:
        return None
