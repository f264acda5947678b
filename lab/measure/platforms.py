"""The platforms `lab validate` knows, one row each: how a node is recognised from its facts (GPU model and count,
NVSwitch), the healthy figures it should reach (cited), and the floors derived from them (a fraction of the healthy
figure, so the floor says how far below health it fails).

The healthy figures, and where they come from (busbw: nccl-tests' all_reduce bus bandwidth, GB/s = 1e9 B/s):
- 8 x H100/H200 SXM on NVSwitch (NVLink 4, NVLS): 464.00 / 468.31 / 473.10 / 475.16 GB/s at 1 / 2 / 4 / 8 GiB,
  nccl-tests on one 8 x H200 node (S. Bekman, "Machine Learning Engineering", network/benchmarks/README.md,
  github.com/stas00/ml-engineering); their median, 470, stands for H100 as well (the same NVLink 4 and third
  generation NVSwitch; issue 26 cites about 460-480 for 8 x H100 with NVLS). Without NVLS (NVLink SHARP, the
  in-switch reduction NCCL uses by default there) the ring's: 370 GB/s, NCCL's effective NVLink 4 bandwidth
  after its ~20% protocol overhead (S. Jeaugey, github.com/NVIDIA/nccl-tests/issues/212; 368.76 GB/s measured
  with NVLS off, github.com/NVIDIA/nccl-tests/issues/309). Which one a node is judged by is read from NCCL's log
  of its all-reduce: a healthy node without NVLS (disabled, or a container without multicast) would fail 376.
- 8 x A100 SXM on NVSwitch (NVLink 3): 235 GB/s, nccl-tests on an A100 node (Bekman, network/README.md,
  "Unidirectional vs Bidirectional").
- All nodes over InfiniBand: 0.94 of the NICs' line rate: 376.71 GB/s at 16 GiB on 4 nodes x 8 x 400 Gb/s NICs
  (Bekman, network/benchmarks/README.md) is 0.94 of 8 x 50 GB/s; NVIDIA reports about 192 GB/s on DGX A100 with
  8 x HDR 200 Gb/s, 0.96 of 8 x 25 GB/s (github.com/NVIDIA/nccl/issues/778); issue 26 cites 370-390 on 8 NDR.
- PCIe: 63 GB/s per direction for Gen5 x16, 31 for Gen4 x16 (Bekman, network/README.md "PCIe"): the host<->device
  figure's ceiling; the floor is 0.6 of the link the GPU should have, under what a link trained to Gen4 or to x8
  can carry at all, so such a link fails.
Floors are FLOOR_FRACTION of the healthy figure: 376 GB/s on 8 x H100 fails a node far from health (NVLS off, a
GPU's NVLinks down); 0.8 x 0.94 x 8 x 50 = 300.8 GB/s on 8 NDR fails a job that lost a rail's worth and more, or
GPUDirect RDMA (each is also checked by name from the node's facts and NCCL's log). Where no figure is published
(PCIe GPUs, GPUs the table does not name) the floor is derived from the PCIe link and is loose: record a healthy
cluster's baseline (`lab validate --record-baseline`) and judge against that.

>>> round(nodes_floor(8, 400.0), 1), round(link_gbps(5, 16), 1), round(link_gbps(4, 8), 1)
(300.8, 63.0, 15.8)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLOOR_FRACTION = 0.8  # of a cited healthy figure
NIC_EFFICIENCY = 0.94  # all-nodes busbw / the NICs' line rate on a healthy fabric (cited above)
HOST_DEVICE_FRACTION = 0.6  # of the PCIe link's rate: under a link trained to half its lanes or a generation down
PCIE_LOOSE_FRACTION = 0.25  # of the PCIe link's rate, for an all-reduce where no figure is published
CPU_FLOOR = 0.01  # GB/s: two gloo processes (or CPU nodes) show the flow works, not a bandwidth

# GB/s per lane and direction after encoding (8b/10b to Gen2, 128b/130b from Gen3)
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
BEKMAN = "stas00/ml-engineering network/benchmarks/README.md"


def link_gbps(gen: int, width: int) -> float:
    """A PCIe link's rate per direction, GB/s (Gen5 x16: 63)."""
    return PCIE_LANE_GBPS.get(gen, 0.0) * width


def nodes_floor(nic_count: int, rate_gbps: float) -> float:
    """The all-nodes floor of a node with `nic_count` NICs at `rate_gbps` Gb/s each, GB/s."""
    return FLOOR_FRACTION * NIC_EFFICIENCY * nic_count * rate_gbps / 8


@dataclass(frozen=True)
class Platform:
    key: str
    name: str
    gpu_models: tuple[str, ...]  # substrings of nvidia-smi's GPU name; () matches any
    gpu_count: int | None  # None: any count
    nvswitch: bool | None  # True: every GPU pair on NVLink; False: not; None: either
    node_healthy_gbps: float | None  # all GPUs of the node, cited; None: derived from the PCIe link
    node_source: str
    node_ring_gbps: float | None  # all GPUs without NVLS, cited, where the platform has NVLS; None: no NVLS
    pair_floor_gbps: float | None  # one GPU pair (only run on request where NVSwitch is); None: as the node
    pcie: tuple[int, int] | None  # (gen, width) each GPU should have
    ib: tuple[int, float, str] | None  # (ports, Gb/s, width) the node should have; None: what it has
    fabric_manager: bool  # NVSwitch boards need nvidia-fabricmanager running
    runs_pairs: bool  # pairs are the primary test (no NVSwitch)


PLATFORMS: tuple[Platform, ...] = (
    Platform(
        "h100-sxm-8",
        "DGX H100 / HGX H100 (8 x H100 SXM, NVSwitch)",
        ("H100",),
        8,
        True,
        470.0,
        f"8 x H200 nccl-tests, median at 1-8 GiB ({BEKMAN}); the same NVLink 4 and NVSwitch",
        370.0,  # NCCL's effective NVLink 4 bandwidth, without NVLS (nccl-tests issues 212 and 309)
        200.0,
        (5, 16),
        (8, 400.0, "4X"),
        True,
        False,
    ),
    Platform(
        "h200-sxm-8",
        "DGX H200 / HGX H200 (8 x H200 SXM, NVSwitch)",
        ("H200",),
        8,
        True,
        470.0,
        f"8 x H200 nccl-tests, median at 1-8 GiB ({BEKMAN})",
        370.0,  # NCCL's effective NVLink 4 bandwidth, without NVLS (nccl-tests issues 212 and 309)
        200.0,
        (5, 16),
        (8, 400.0, "4X"),
        True,
        False,
    ),
    Platform(
        "a100-sxm-8",
        "DGX A100 / HGX A100 (8 x A100 SXM4, NVSwitch)",
        ("A100-SXM", "A100 SXM"),
        8,
        True,
        235.0,
        "A100 node nccl-tests (stas00/ml-engineering network/README.md)",
        None,
        135.0,
        (4, 16),
        (8, 200.0, "4X"),
        True,
        False,
    ),
    Platform(
        "pcie",
        "PCIe GPUs without NVSwitch",
        (),
        None,
        False,
        None,
        "no published figure: derived from each GPU's PCIe link",
        None,
        None,
        None,
        None,
        False,
        True,
    ),
    Platform(
        "gpu",
        "GPUs the table does not name",
        (),
        None,
        None,
        None,
        "no published figure: derived from each GPU's PCIe link",
        None,
        None,
        None,
        None,
        False,
        True,
    ),
    Platform(
        "cpu",
        "CPU only (no NVIDIA GPU)",
        (),
        0,
        None,
        None,
        "two gloo processes show the flow works",
        None,
        CPU_FLOOR,
        None,
        None,
        False,
        True,
    ),
)
BY_KEY = {platform.key: platform for platform in PLATFORMS}


def _excluded(name: str) -> bool:
    """PCIe and NVL cards share the model number with the SXM parts ("NVIDIA H100 PCIe", "NVIDIA H200 NVL")."""
    return any(word in name.upper() for word in ("PCIE", " NVL"))


def pick(gpus: list[dict[str, Any]], all_nvlink: bool) -> tuple[Platform, str]:
    """The node's platform from its GPUs (nvidia-smi) and whether NVLink joins every pair (nvidia-smi topo), and
    why in words."""
    if not gpus:
        return BY_KEY["cpu"], "no NVIDIA GPU listed by nvidia-smi"
    names = sorted({gpu["name"] for gpu in gpus})
    seen = f"{len(gpus)} x {', '.join(names)}, " + (
        "NVLink between every pair" if all_nvlink else "not every pair on NVLink"
    )
    for platform in PLATFORMS[:3]:
        if (
            len(gpus) == platform.gpu_count
            and all_nvlink
            and len(names) == 1
            and not _excluded(names[0])
            and any(model in names[0] for model in platform.gpu_models)
        ):
            return platform, seen
    if not all_nvlink:
        return BY_KEY["pcie"], seen
    return BY_KEY["gpu"], seen + " (not a platform of the table)"


def floors(
    platform: Platform, gpus: list[dict[str, Any]], active_ib: list[dict[str, Any]], nvls: bool | None = None
) -> tuple[dict[str, float], dict[str, str]]:
    """(floor per key, where each came from) for a node of `platform` with these GPUs and active IB ports;
    `nvls`: whether NCCL's log of the node's all-reduce shows NVLS (False: judged at the ring's figure).
    Keys: node (all its GPUs), pair (one pair / two CPU processes), nodes (all nodes together; ring pairs),
    host_device (pinned copies, each direction, per GPU). Table-named platforms scale the all-nodes floor by the
    NICs they should have, others by the ports found Active (a missing rail there lowers its own floor)."""
    if platform.key == "cpu":
        source = "platform cpu: two gloo processes show the flow works"
        return {"node": CPU_FLOOR, "pair": CPU_FLOOR, "nodes": CPU_FLOOR}, {
            "node": source,
            "pair": source,
            "nodes": source,
        }
    out: dict[str, float] = {}
    sources: dict[str, str] = {}
    gen, width = platform.pcie or _found_link(gpus)
    link = link_gbps(gen, width)
    if platform.node_ring_gbps is not None and nvls is False:
        out["node"] = FLOOR_FRACTION * platform.node_ring_gbps
        sources["node"] = (
            f"{FLOOR_FRACTION:g} x {platform.node_ring_gbps:g} GB/s without NVLS (NCCL's log shows none: the "
            f"ring's NVLink 4 figure, NVIDIA/nccl-tests issues 212 and 309)"
        )
    elif platform.node_healthy_gbps is not None:
        out["node"] = FLOOR_FRACTION * platform.node_healthy_gbps
        sources["node"] = f"{FLOOR_FRACTION:g} x {platform.node_healthy_gbps:g} GB/s ({platform.node_source})"
    else:
        out["node"] = PCIE_LOOSE_FRACTION * link
        sources["node"] = (
            f"{PCIE_LOOSE_FRACTION:g} x the PCIe Gen{gen} x{width} link ({link:.3g} GB/s): "
            f"{platform.node_source}; record a baseline"
        )
    if platform.pair_floor_gbps is not None:
        out["pair"] = platform.pair_floor_gbps
        sources["pair"] = (
            "0.45 x the NVLink bandwidth per GPU and direction (450 GB/s NVLink 4, 300 NVLink 3; "
            "stas00/ml-engineering network/README.md)"
        )
    else:
        out["pair"], sources["pair"] = out["node"], sources["node"]
    if platform.ib is not None:
        count, rate, _ = platform.ib
        said = f"the {count} x {rate:g} Gb/s NICs {platform.name.split(' (')[0]} has"
    else:
        count = len(active_ib)
        rate = min((port["rate_gbps"] or 0.0 for port in active_ib), default=0.0)
        said = f"the {count} Active InfiniBand port(s) found, at {rate:g} Gb/s"
    if count and rate:
        out["nodes"] = nodes_floor(count, rate)
        sources["nodes"] = f"{FLOOR_FRACTION:g} x {NIC_EFFICIENCY:g} x the line rate of {said}"
    else:
        out["nodes"] = CPU_FLOOR
        sources["nodes"] = "no InfiniBand port: only that the all-reduce across nodes works"
    out["host_device"] = HOST_DEVICE_FRACTION * link
    sources["host_device"] = (
        f"{HOST_DEVICE_FRACTION:g} x the PCIe Gen{gen} x{width} link ({link:.3g} GB/s per "
        f"direction) each GPU {'should have' if platform.pcie else 'reports as its maximum'}"
    )
    return {key: round(value, 1) for key, value in out.items()}, sources  # GB/s to 0.1: floors, not measurements


def _found_link(gpus: list[dict[str, Any]]) -> tuple[int, int]:
    """The best link any GPU reports it can have (nvidia-smi's max), Gen3 x16 when none says."""
    links = [
        (gpu["pcie_gen_max"], gpu["pcie_width_max"])
        for gpu in gpus
        if gpu.get("pcie_gen_max") and gpu.get("pcie_width_max")
    ]
    return max(links, default=(3, 16))


def describe() -> list[dict[str, Any]]:
    """The table for docs and validate.json's definitions: each platform with its floors before any override."""
    return [
        {
            "key": p.key,
            "name": p.name,
            "node_healthy_gbps": p.node_healthy_gbps,
            "source": p.node_source,
            "pcie": p.pcie,
            "ib": p.ib,
        }
        for p in PLATFORMS
    ]
