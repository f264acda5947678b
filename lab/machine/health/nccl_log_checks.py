"""What NCCL's own log (NCCL_DEBUG=INFO) shows of a node's fabric, for `lab validate`: its network channels per host
(GPUDirect RDMA, InfiniBand without it, sockets) and whether NVLS ran, each judged as a check's record
(lab.machine.health.fabric_checks.check).

GPUDirect RDMA is asserted from that log: a channel to another node over InfiniBand reads "via NET/IB/<n>/GDRDMA" when
the NIC reads and writes GPU memory directly, "via NET/IB/<n>" when it bounces through host memory, "via NET/Socket"
without InfiniBand at all. Through DMA-BUF NCCL logs "GPU Direct RDMA (DMABUF) enabled" per HCA (nvidia-peermem:
"GPU Direct RDMA (nvidia-peermem) enabled"); whether the node could use either is fabric_checks.gpudirect_support's.

>>> nccl_channels("h1:1:2 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA")
{'h1': {'gdrdma': 1, 'ib': 0, 'socket': 0, 'dmabuf': False}}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lab.machine.health.fabric_checks import check
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, NOT_RUN

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
            "nvls", NOT_APPLICABLE, "unknown: no NCCL_DEBUG=INFO lines in the node's log; judged at the NVLS figure"
        ), None
    if NVLS_COMM.search(log):
        return check("nvls", HELD, "NCCL set up NVLS (NVLink SHARP) for the node's all-reduce"), True
    return (
        check(
            "nvls",
            NOT_APPLICABLE,
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
        return check("gdrdma", FAILED, f"{log_name} has no NCCL INFO channel line (run it with NCCL_DEBUG=INFO)"), [
            f"gdrdma: {log_name} has no NCCL INFO channel line: GPUDirect RDMA not shown (NCCL_DEBUG=INFO)"
        ]
    if not mine:
        return check("gdrdma", NOT_RUN, f"{log_name} holds no line of this node (only the head's output)"), [
            f"gdrdma: {log_name} holds no NCCL line of this node, so its GPUDirect RDMA was not seen: gather every "
            "node's NCCL_DEBUG=INFO output into it"
        ]
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
        return check("gdrdma", FAILED, f"{said}; {total['gdrdma']} with GDRDMA{how}"), [
            f"gdrdma: GPUDirect RDMA not used: {log_name} shows {said} (nvidia_peermem or DMA-BUF, NCCL_NET_GDR_LEVEL)"
        ]
    return check("gdrdma", HELD, f"{total['gdrdma']} InfiniBand channel(s), all via GDRDMA{how}"), []
