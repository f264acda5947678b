"""`lab validate`: a fabric check's facts and all-reduce results judged by platform into validate.json, and `lab
report` reading it. The facts are canned (tests/fixtures/fabric/README.md says where their formats come from): no
DGX is lent to these tests; scripts/node-facts.sh itself runs for real in test_fabric_facts.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab import cli
from lab.course.teaching import report
from lab.errors import LabError
from lab.machine.health import validate as fabric
from lab.measure import platforms
from tests.markdown import problems

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/fabric"
GiB = 1 << 30


def _allreduce(
    world_size: int = 2,
    busbw: float = 0.2,
    gpus: bool = False,
    wrong: int = 0,
    sizes: tuple[int, ...] | None = None,
    device: str = "NVIDIA H100 80GB HBM3",
) -> dict:
    """A `lab bench allreduce --json` result in the shape a real run writes (device names per rank). GPU runs span
    1-8 GiB as slurm/validate.sbatch asks; the small sizes below are slower, as a real sweep is."""
    sizes = sizes or ((GiB // 4, GiB, 2 * GiB, 4 * GiB, 8 * GiB) if gpus else (65536, 262144, 1048576))

    def row(size: int, oop_wrong: int) -> dict:
        figure = busbw if size >= GiB or not gpus else busbw / 2
        return {
            "size": size,
            "count": size // 4,
            "type": "float",
            "redop": "sum",
            "root": -1,
            "oop_time_us": 100.0,
            "oop_algbw": figure,
            "oop_busbw": figure * 0.98,
            "oop_wrong": oop_wrong,
            "ip_time_us": 100.0,
            "ip_algbw": figure,
            "ip_busbw": figure,
            "ip_wrong": 0,
        }

    rows = [row(size, wrong if i == 0 else 0) for i, size in enumerate(sizes)]
    return {
        "benchmark": "allreduce",
        "world_size": world_size,
        "backend": "nccl" if gpus else "gloo",
        "dtype": "float32",
        "op": "sum",
        "iters": 2,
        "warmup_iters": 1,
        "definitions": {"algbw": "bytes / time, GB/s (1e9)", "busbw": "algbw * 2 (n-1) / n"},
        "rows": rows,
        "avg_busbw": sum(r["oop_busbw"] for r in rows) / len(rows),
        "link": None,
        "link_gbps": None,
        "min_busbw": None,
        "gate_missed": False,
        "hosts": ["vm"],
        "devices": [device] * world_size if gpus else ["cpu"] * world_size,
        "environment": {},
    }


def _hostdevice(h2d: float = 53.0, gpus: int = 8) -> dict:
    """`lab bench hostdevice --json` as lab/measure/bench/comm/hostdevice.py's docstring lays it out."""
    return {
        "benchmark": "hostdevice",
        "method": "torch",
        "device": "cuda",
        "size_bytes": 256 << 20,
        "iters": 20,
        "warmup_iters": 2,
        "pinned": True,
        "gpus": [
            {"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}", "h2d_gbps": h2d, "d2h_gbps": h2d + 1}
            for i in range(gpus)
        ],
        "d2d_gbps": [[1500.0 if i == j else 380.0 for j in range(gpus)] for i in range(gpus)],
        "peer_access": [[True] * gpus for _ in range(gpus)],
    }


def _facts(folder: Path, node: str, **changes: str | tuple[str, int] | None) -> Path:
    """facts-NODE/: the healthy DGX H100 of tests/fixtures/fabric/h100, with `changes` replacing a fact's text (or
    its (text, rc)); None removes the fact (as if the script had not written it)."""
    target = folder / f"facts-{node}"
    shutil.copytree(FIXTURES / "h100", target)
    (target / "hostname.txt").write_text(f"{node}\n")
    for name, change in changes.items():
        name = name.replace("_", "-")
        if change is None:
            (target / f"{name}.txt").unlink()
            (target / f"{name}.rc").unlink()
            continue
        text, rc = change if isinstance(change, tuple) else (change, 0)
        (target / f"{name}.txt").write_text(text)
        (target / f"{name}.rc").write_text(f"{rc}\n")
    return target


# NCCL_DEBUG=INFO lines of a node's all-reduce where NCCL set up NVLS (src/transport/nvls.cc's INFO line)
NVLS_LOG = (
    "{node}:4242:4250 [0] NCCL INFO NVLS multicast support is available on dev 0\n"
    "{node}:4242:4250 [0] NCCL INFO NVLS comm 0x55d0c0 headRank 0 nHeads 8 buffSize 1048576 memSize 2097152\n"
)


def _dgx_job(
    tmp_path: Path, nodes: tuple[str, ...] = ("dgx01", "dgx02"), facts: dict | None = None, **files: dict | str | None
) -> Path:
    """Healthy DGX H100 nodes: facts, the all-GPU all-reduce (471 GB/s at 1-8 GiB), pinned copies, and all nodes
    together (381 GB/s, NCCL's log with GDRDMA). `facts`: {node: changes}; `files` replace (None: remove) a file."""
    folder = tmp_path / "validate"
    folder.mkdir(parents=True)
    for node in nodes:
        _facts(folder, node, **(facts or {}).get(node, {}))
    content = {
        **{f"node-{n}.json": _allreduce(8, 471.0, gpus=True) for n in nodes},
        **{f"node-{n}.log": NVLS_LOG.format(node=n) for n in nodes},
        **{f"hostdevice-{n}.json": _hostdevice() for n in nodes},
        "nodes.json": _allreduce(8 * len(nodes), 381.0, gpus=True),
        "nodes.log": (FIXTURES / "nodes-gdrdma.log").read_text(),
        **files,
    }
    for name, body in content.items():
        if body is not None:
            (folder / name).write_text(body if isinstance(body, str) else json.dumps(body))
    return folder


def _cpu_job(tmp_path: Path, nodes: tuple[str, ...] = ("a", "b"), **files: dict | str | None) -> Path:
    folder = tmp_path / "validate"
    folder.mkdir(parents=True)
    content = {**{f"node-{n}.json": _allreduce() for n in nodes}, "nodes.json": _allreduce(2 * len(nodes)), **files}
    for name, body in content.items():
        if body is not None:
            (folder / name).write_text(body if isinstance(body, str) else json.dumps(body))
    return folder


def _only(doc: dict, node: str = "dgx02") -> list[str]:
    """The problems of one node (the healthy one must have none)."""
    assert not [p for p in doc["problems"] if p.startswith("dgx01")], doc["problems"]
    return [p for p in doc["problems"] if p.startswith(node)]


# ----------------------------------------------------------------------------- platforms and floors


def test_a_healthy_dgx_h100_pair_passes_every_check_with_its_platforms_floors(tmp_path):
    doc = fabric.verdict(_dgx_job(tmp_path), ["dgx01", "dgx02"], "v1")
    assert doc["ok"], doc["problems"]
    record = doc["nodes"]["dgx01"]
    assert record["platform"]["key"] == "h100-sxm-8" and record["gpus"] == 8
    assert record["floors"] == pytest.approx(
        {"node": 376.0, "pair": 200.0, "nodes": 300.8, "host_device": 37.8}, abs=0.05
    )
    assert "stas00/ml-engineering" in record["floor_sources"]["node"]
    assert {c["name"]: c["verdict"] for c in record["checks"]} == {
        "gpus": "held",
        "nvls": "held",
        "pcie": "held",
        "fabric-manager": "held",
        "fabric-state": "held",
        "infiniband": "held",
        "gpudirect-support": "held",
        "gdrdma": "held",
        "dcgm-diag": "held",
        "xid": "held",
        "row-remap": "held",
    }
    assert record["pairs"][0]["busbw"] == 471.0 and record["pairs"][0]["judged_at"] == "median of 4 size(s) 1 GiB-8 GiB"
    assert record["health"] == {
        "dcgm_diag": "held",
        "xid_events": 0,
        "dcgm_level": 2,
        "ecc_uncorrected": {str(i): "0" for i in range(8)},
    }
    assert record["facts"]["nvlink_all_pairs"] and len(record["facts"]["infiniband_active"]) == 8
    assert "DMA-BUF" in next(c for c in record["checks"] if c["name"] == "gdrdma")["detail"]
    assert doc["all_nodes"]["busbw"] == 381.0 and doc["all_nodes"]["floor"] == pytest.approx(300.8)
    assert doc["ring"] == {} and not doc["ring_needed"] and doc["suspects"] == [] and doc["platform"] == "slurm"


@pytest.mark.parametrize(
    "name, topo_link, count, key, node_floor, nodes_floor, host_device",
    [
        ("NVIDIA H100 80GB HBM3", "NV18", 8, "h100-sxm-8", 376.0, 300.8, 37.8),
        ("NVIDIA H200", "NV18", 8, "h200-sxm-8", 376.0, 300.8, 37.8),
        ("NVIDIA A100-SXM4-80GB", "NV12", 8, "a100-sxm-8", 188.0, 150.4, 18.9),
        ("NVIDIA H100 PCIe", "SYS", 4, "pcie", 15.8, 300.8, 37.8),  # PCIe floors from its Gen5 x16 link; 8 NDR found
        ("NVIDIA H100 80GB HBM3", "NV18", 4, "gpu", 15.8, 300.8, 37.8),  # 4 GPUs: no platform of the table
    ],
)
def test_each_platform_is_picked_from_the_facts_with_its_floors(
    name, topo_link, count, key, node_floor, nodes_floor, host_device
):
    gpus = [
        {
            "index": i,
            "name": name,
            "pcie_gen_current": 5,
            "pcie_gen_max": 5 if "A100" not in name else 4,
            "pcie_width_current": 16,
            "pcie_width_max": 16,
        }
        for i in range(count)
    ]
    platform, why = platforms.pick(gpus, all_nvlink=topo_link.startswith("NV"))
    assert platform.key == key and f"{count} x {name}" in why
    active = [{"ca": f"mlx5_{n}", "port": 1, "rate_gbps": 400.0, "width": "4X"} for n in range(8)]
    floors, sources = platforms.floors(platform, gpus, active)
    assert floors["node"] == pytest.approx(node_floor, abs=0.05)
    assert floors["nodes"] == pytest.approx(nodes_floor if key != "a100-sxm-8" else 150.4, abs=0.05)
    assert floors["host_device"] == pytest.approx(host_device, abs=0.05)
    assert all(sources[k] for k in floors)


def test_a_cpu_node_is_two_gloo_processes_against_the_cpu_floor_and_its_facts_not_applicable(tmp_path):
    doc = fabric.verdict(_cpu_job(tmp_path), ["a", "b"], "v1")
    assert doc["ok"], doc["problems"]
    b = doc["nodes"]["b"]
    assert b["platform"]["key"] == "cpu" and b["gpus"] == 0 and b["pairs"][0]["pair"] == "cpu"
    assert b["floors"] == {"node": 0.01, "pair": 0.01, "nodes": 0.01} and doc["all_nodes"]["floor"] == 0.01
    assert b["pairs"][0]["judged_at"] == "largest size 1 MiB (the run had none >= 1 GiB)"
    assert b["checks"][0]["verdict"] == "not applicable" and b["checks"][1]["verdict"] == "not applicable"


# ----------------------------------------------------------------------------- a degraded node


def test_nvls_off_150_gbps_on_8_h100_fails_the_node_by_name(tmp_path):
    doc = fabric.verdict(
        _dgx_job(tmp_path, **{"node-dgx02.json": _allreduce(8, 150.0, gpus=True)}), ["dgx01", "dgx02"], "v1"
    )
    assert _only(doc) == [
        "dgx02: all-reduce of GPUs 0,1,2,3,4,5,6,7: busbw 150 GB/s, below its floor 376 GB/s "
        "(NVLS off, an NVLink down or the fabric manager?)"
    ]


def test_gpudirect_rdma_absent_from_ncclss_log_fails_each_node_that_logged_it(tmp_path):
    nccl = (FIXTURES / "nodes-no-gdrdma.log").read_text()
    doc = fabric.verdict(_dgx_job(tmp_path, **{"nodes.log": nccl}), ["dgx01", "dgx02"], "v1")
    assert doc["problems"] == [
        f"{node}: gdrdma: GPUDirect RDMA not used: nodes.log shows 16 InfiniBand channel(s) without GDRDMA "
        f"(nvidia_peermem or DMA-BUF, NCCL_NET_GDR_LEVEL)"
        for node in ("dgx01", "dgx02")
    ]


def test_a_log_without_nccl_info_lines_is_unreadable_not_a_pass(tmp_path):
    doc = fabric.verdict(_dgx_job(tmp_path, **{"nodes.log": "starting\n"}), ["dgx01", "dgx02"], "v1")
    assert all("gdrdma: nodes.log has no NCCL INFO channel line" in p for p in doc["problems"])
    waived = fabric.verdict(
        _dgx_job(tmp_path / "2", **{"nodes.log": "x\n"}),
        ["dgx01", "dgx02"],
        "v1",
        fabric.Settings(expect=fabric.parse_expect(["gdrdma=no"])),
    )
    assert waived["ok"], waived["problems"]


def test_a_node_missing_from_ncclss_log_was_not_checked_and_does_not_pass(tmp_path):
    """Slurm's srun and the validate play both gather every node's output into nodes.log: a node with no line there
    had its GPUDirect RDMA seen by no one, so its gdrdma check was not run, which is not a pass (lab.verdict)."""
    only_dgx01 = "".join(
        line + "\n" for line in (FIXTURES / "nodes-gdrdma.log").read_text().splitlines() if line.startswith("dgx01")
    )
    doc = fabric.verdict(_dgx_job(tmp_path, **{"nodes.log": only_dgx01}), ["dgx01", "dgx02"], "v1")
    gdrdma = {name: next(c for c in n["checks"] if c["name"] == "gdrdma") for name, n in doc["nodes"].items()}
    assert gdrdma["dgx01"]["verdict"] == "held" and gdrdma["dgx02"]["verdict"] == "not run"
    assert doc["problems"] == [
        "dgx02: gdrdma: nodes.log holds no NCCL line of this node, so its GPUDirect RDMA was not seen: gather every "
        "node's NCCL_DEBUG=INFO output into it"
    ]


def test_an_ib_rail_at_200_gbps_fails_naming_the_port(tmp_path):
    width = (
        (FIXTURES / "h100/ib-width.txt")
        .read_text()
        .replace(
            "mlx5_3 port 1: state=4: ACTIVE; phys_state=5: LinkUp; rate=400 Gb/sec (4X NDR)",
            "mlx5_3 port 1: state=4: ACTIVE; phys_state=5: LinkUp; rate=200 Gb/sec (4X HDR)",
        )
    )
    ibstat = (FIXTURES / "h100/ibstat.txt").read_text()
    at = ibstat.index("CA 'mlx5_3'")
    ibstat = ibstat[:at] + ibstat[at:].replace("Rate: 400", "Rate: 200", 1)
    doc = fabric.verdict(
        _dgx_job(tmp_path, facts={"dgx02": {"ib_width": width, "ibstat": ibstat}}), ["dgx01", "dgx02"], "v1"
    )
    assert _only(doc) == [
        "dgx02: infiniband: 7 of 8 expected port(s) Active at 400 Gb/s 4X (ib-width and ibstat): "
        "mlx5_3/1 Active at 200 Gb/s 4X, expected 400 Gb/s 4X"
    ]


def test_a_rail_down_fails_naming_its_state(tmp_path):
    width = (
        (FIXTURES / "h100/ib-width.txt")
        .read_text()
        .replace(
            "mlx5_5 port 1: state=4: ACTIVE; phys_state=5: LinkUp",
            "mlx5_5 port 1: state=1: DOWN; phys_state=3: Disabled",
        )
    )
    doc = fabric.verdict(
        _dgx_job(tmp_path, facts={"dgx02": {"ib_width": width, "ibstat": None}}), ["dgx01", "dgx02"], "v1"
    )
    assert _only(doc) == [
        "dgx02: infiniband: 7 of 8 expected port(s) Active at 400 Gb/s 4X (ib-width): mlx5_5/1 is Down"
    ]


def test_a_gpu_on_pcie_gen4_x8_fails_by_its_link_and_its_copies(tmp_path):
    gpus = (FIXTURES / "h100/nvidia-smi-gpus.txt").read_text().splitlines()
    gpus[5] = gpus[5].replace("81559, 5, 5, 16, 16", "81559, 4, 5, 8, 16")
    copies = _hostdevice()
    copies["gpus"][5].update(h2d_gbps=12.1, d2h_gbps=12.9)
    doc = fabric.verdict(
        _dgx_job(
            tmp_path, facts={"dgx02": {"nvidia_smi_gpus": "\n".join(gpus) + "\n"}}, **{"hostdevice-dgx02.json": copies}
        ),
        ["dgx01", "dgx02"],
        "v1",
    )
    assert _only(doc) == [
        "dgx02: pcie: GPU 5: PCIe Gen4 x8 (max Gen5 x16): x8 is below its maximum x16 (a link trained down)",
        "dgx02: host<->device copies below their floor 37.8 GB/s: GPU 5 h2d 12.1 GB/s, GPU 5 d2h 12.9 GB/s "
        "(a PCIe link trained down?)",
    ]


def test_an_idle_gpus_lowered_pcie_generation_is_a_note_not_a_failure(tmp_path):
    idle = (FIXTURES / "h100/nvidia-smi-gpus.txt").read_text().replace("81559, 5, 5, 16, 16", "81559, 1, 5, 16, 16")
    doc = fabric.verdict(_dgx_job(tmp_path, facts={"dgx02": {"nvidia_smi_gpus": idle}}), ["dgx01", "dgx02"], "v1")
    assert doc["ok"], doc["problems"]
    assert next(c for c in doc["nodes"]["dgx02"]["checks"] if c["name"] == "pcie")["verdict"] == "held"


def test_health_facts_each_fail_by_name(tmp_path):
    q = (FIXTURES / "h100/nvidia-smi-q.txt").read_text()
    at = q.index("GPU 00000000:5D:00.0")
    q = q[:at] + q[at:].replace(
        "State                             : Completed", "State                             : In Progress", 1
    )
    rows = (
        (FIXTURES / "h100/remapped-rows.txt")
        .read_text()
        .replace("00000000:9A:00.0, 0, 0, No, No", "00000000:9A:00.0, 0, 1, Yes, No")
    )
    diag = (
        (FIXTURES / "h100/dcgmi-diag.txt")
        .read_text()
        .replace("| PCIe                      | Pass - All    ", "| PCIe                      | Fail - GPU: 3 ")
    )
    xid = "Mar 12 09:58:11 dgx02 kernel: NVRM: Xid (PCI:0000:ab:00): 79, pid=0, GPU has fallen off the bus.\n"
    doc = fabric.verdict(
        _dgx_job(
            tmp_path,
            facts={
                "dgx02": {
                    "fabricmanager": ("inactive\n", 3),
                    "nvidia_smi_q": q,
                    "remapped_rows": rows,
                    "dcgmi_diag": (diag, 226),
                    "journal_xid": xid,
                    "modules": (FIXTURES / "h100/modules.txt").read_text(),
                    "kernel": "5.4.0-150-generic\n",
                }
            },
        ),
        ["dgx01", "dgx02"],
        "v1",
    )
    assert _only(doc) == [
        "dgx02: fabric-manager: nvidia-fabricmanager is inactive on an NVSwitch system; sudo systemctl start "
        "nvidia-fabricmanager (its package must be the driver's version, 550.54.15; B200 and later also need NVLSM), "
        "then check that `nvidia-smi -q | grep -A 2 Fabric` says State: Completed",
        "dgx02: fabric-state: GPU fabric not completed (00000000:5D:00.0: State In Progress, Status Success): is "
        "nvidia-fabricmanager running?",
        "dgx02: gpudirect-support: nvidia_peermem is not loaded and DMA-BUF is not possible: kernel "
        "5.4.0-150-generic (DMA-BUF needs 5.12 or later)",
        "dgx02: dcgmi diag -r 2: PCIe: Fail - GPU: 3",
        "dgx02: xid: 1 XID(s) since boot (the kernel journal) (threshold 0): Xid 79 on PCI:0000:ab:00",
        "dgx02: row-remap: 00000000:9A:00.0: pending (pending: reset the GPU; failure: the GPU needs service)",
    ]
    assert doc["nodes"]["dgx02"]["health"]["xid_events"] == 1


def test_xids_under_the_expected_threshold_pass(tmp_path):
    xid = "kernel: NVRM: Xid (PCI:0000:ab:00): 13, Graphics Exception\n" * 2
    folder = _dgx_job(tmp_path, facts={"dgx02": {"journal_xid": xid}})
    assert fabric.verdict(
        folder, ["dgx01", "dgx02"], "v1", fabric.Settings(expect=fabric.parse_expect(["dgx02:xid_max=2"]))
    )["ok"]


def test_an_unreadable_journal_says_unreadable_never_0_xids(tmp_path):
    facts = {"dgx02": {"journal_xid": "", "journal_kernel_lines": "0\n"}}
    doc = fabric.verdict(_dgx_job(tmp_path, facts=facts), ["dgx01", "dgx02"], "v1")
    assert _only(doc) == [
        "dgx02: xid: the kernel journal is unreadable: journalctl read no kernel message of this "
        "boot (no journal rights, or no journal), and DCGM gave no XID field; --expect journal=skip waives it"
    ]
    assert doc["nodes"]["dgx02"]["health"]["xid_events"] == "unreadable"
    denied = {"dgx02": {"journal_xid": "No journal files were opened due to insufficient permissions.\n"}}
    doc = fabric.verdict(_dgx_job(tmp_path / "2", facts=denied), ["dgx01", "dgx02"], "v1")
    assert "journalctl says 'insufficient permissions'" in _only(doc)[0]


def test_without_journal_rights_dcgm_gives_the_xids_and_application_xids_are_not_counted(tmp_path):
    """An ordinary Slurm user cannot read the kernel journal; DCGM's last XID of each GPU needs no rights. XIDs an
    application causes (13, 31, 43, 45: a faulting kernel, a killed process) are reported, not held against the
    node; a GPU's own (79: fallen off the bus) still fails it."""
    no_rights = {"journal_xid": "", "journal_kernel_lines": "0\n"}
    dcgm = "#Entity   XID\nID\n" + "".join(f"GPU {i}     {13 if i == 2 else 0}\n" for i in range(8))
    doc = fabric.verdict(_dgx_job(tmp_path, facts={"dgx02": {**no_rights, "dcgm_xid": dcgm}}), ["dgx01", "dgx02"], "v1")
    assert _only(doc) == [], doc["problems"]
    detail = {c["name"]: c["detail"] for c in doc["nodes"]["dgx02"]["checks"]}["xid"]
    assert detail.startswith("0 XID(s) as each GPU's last (DCGM; the journal: journalctl read no kernel message")
    assert detail.endswith("; 1 from applications (13, 31, 43, 45), not counted")
    dead = dcgm.replace("GPU 5     0", "GPU 5     79")
    doc = fabric.verdict(
        _dgx_job(tmp_path / "2", facts={"dgx02": {**no_rights, "dcgm_xid": dead}}), ["dgx01", "dgx02"], "v1"
    )
    assert [p for p in _only(doc) if "xid" in p][0].startswith(
        "dgx02: xid: 1 XID(s) as each GPU's last (DCGM; the journal: journalctl read no kernel message"
    ) and "Xid 79 on GPU 5" in _only(doc)[0]
    journal = "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, Graphics Exception\n"  # from the journal, as root
    doc = fabric.verdict(_dgx_job(tmp_path / "3", facts={"dgx02": {"journal_xid": journal}}), ["dgx01", "dgx02"], "v1")
    assert _only(doc) == [] and doc["nodes"]["dgx02"]["health"]["xid_events"] == 0


def test_a_missing_tool_is_not_present_never_a_pass(tmp_path):
    facts = {
        "dgx02": {
            "ibstat": ("ibstat: not installed\n", 127),
            "ib_width": ("no sysfs\n", 127),
            "dcgmi_diag": ("dcgmi: not installed\n", 127),
        }
    }
    doc = fabric.verdict(_dgx_job(tmp_path, facts=facts), ["dgx01", "dgx02"], "v1")
    assert _only(doc) == [
        "dgx02: infiniband: ibstat: not present (ibstat: not installed); ib-width: not present (no sysfs); 8 port(s) "
        "expected",
        "dgx02: dcgmi diag -r 2: dcgmi-diag: not present (dcgmi: not installed); --expect dcgm=skip waives it",
    ]
    assert doc["nodes"]["dgx02"]["health"]["dcgm_diag"] == "failed: dcgmi-diag: not present (dcgmi: not installed)"
    no_facts = fabric.verdict(_dgx_job(tmp_path / "2"), ["dgx01", "dgx02", "dgx09"], "v1")
    assert (
        "dgx09: facts: no facts-dgx09/ (scripts/node-facts.sh did not run on it): its GPUs, links and health "
        "are unchecked" in no_facts["problems"]
    )


# ----------------------------------------------------------------------------- the ring


def test_the_ring_is_asked_for_then_names_the_node_in_two_slow_pairs(tmp_path):
    nodes = ("dgx01", "dgx02", "dgx03")
    slow = _allreduce(24, 120.0, gpus=True)
    two = (FIXTURES / "nodes-gdrdma.log").read_text()  # NCCL's lines of dgx01 and dgx02; dgx03's are dgx01's
    logs = {"nodes.json": slow, "nodes.log": two + two.replace("dgx01", "dgx03")}
    first = fabric.verdict(_dgx_job(tmp_path, nodes, **logs), list(nodes), "v1")
    assert first["ring_needed"] and first["problems"] == [
        "all nodes: 24 ranks: busbw 120 GB/s, below 300.8 GB/s, the highest floor among them"
    ]
    ring = {
        "ring-dgx01_dgx02.json": _allreduce(16, 380.0, gpus=True),
        "ring-dgx02_dgx03.json": _allreduce(16, 110.0, gpus=True),
        "ring-dgx03_dgx01.json": _allreduce(16, 105.0, gpus=True),
    }
    again = fabric.verdict(_dgx_job(tmp_path / "2", nodes, **logs, **ring), list(nodes), "v1")
    assert not again["ring_needed"] and again["suspects"] == ["dgx03"]
    assert {name: r["ok"] for name, r in again["ring"].items()} == {
        "dgx01+dgx02": True,
        "dgx02+dgx03": False,
        "dgx03+dgx01": False,
    }
    assert again["problems"] == [
        "all nodes: 24 ranks: busbw 120 GB/s, below 300.8 GB/s, the highest floor among them; slow node: dgx03"
    ]


def test_a_node_scoped_floor_is_the_ring_pairs_floor_as_in_the_role(tmp_path):
    """The validate role's test, here with CPU nodes: c demands an impossible floor of any check across nodes it
    is in, so all nodes miss, and of the ring only a+b passes; c is the slow node."""
    nodes = ("a", "b", "c")
    ring = {f"ring-{x}_{y}.json": _allreduce(4) for x, y in fabric.ring_pairs(list(nodes))}
    folder = _cpu_job(tmp_path, nodes, **ring)
    settings = fabric.Settings(floors=fabric.parse_floors(["c:nodes=1e9", "b:pair=1e9"]))
    doc = fabric.verdict(folder, list(nodes), "v1", settings)
    assert doc["problems"][0].startswith(
        "b: all-reduce of two CPU processes: busbw 0.2 GB/s, below its floor 1e+09 GB/s"
    )
    assert doc["problems"][1].startswith("all nodes: 6 ranks: busbw 0.2 GB/s, below 1e+09 GB/s") and doc["problems"][
        1
    ].endswith("; slow node: c")
    assert doc["suspects"] == ["c"] and doc["all_nodes"]["floor"] == 1e9


# ----------------------------------------------------------------------------- the baseline


def test_a_recorded_baseline_then_fails_a_figure_under_its_fraction_naming_figure_value_and_baseline(tmp_path, capsys):
    baseline = tmp_path / "healthy.json"
    code = cli.main(
        [
            "validate",
            str(_dgx_job(tmp_path / "1")),
            "--nodes",
            "dgx01,dgx02",
            "--run-id",
            "v1",
            "--out",
            str(tmp_path / "v1.json"),
            "--record-baseline",
            str(baseline),
        ]
    )
    assert code == 0 and f"baseline written to {baseline}" in capsys.readouterr().out
    recorded = json.loads(baseline.read_text())
    assert recorded["nodes"]["dgx02"] == {"platform": "h100-sxm-8", "node": 471.0, "host_device": 53.0}
    assert recorded["platforms"]["h100-sxm-8"] == {"node": 471.0, "host_device": 53.0}
    assert recorded["all_nodes"] == {"busbw": 381.0, "world_size": 16, "hosts": ["dgx01", "dgx02"]}
    later = _dgx_job(tmp_path / "2", **{"node-dgx02.json": _allreduce(8, 400.0, gpus=True)})
    args = ["validate", str(later), "--nodes", "dgx01,dgx02", "--run-id", "v2", "--out", str(tmp_path / "v2.json")]
    assert cli.main(args) == 0  # 400 is above the platform's floor, 376
    capsys.readouterr()
    assert cli.main([*args, "--baseline", str(baseline)]) == 0  # and above 0.8 x 471 = 376.8
    capsys.readouterr()
    assert cli.main([*args, "--baseline", str(baseline), "--baseline-fraction", "0.9"]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        "dgx02: all-reduce of GPUs 0,1,2,3,4,5,6,7: busbw 400 GB/s, below its floor 423.9 GB/s (baseline: 0.9 x "
        "471 GB/s (node dgx02)) (NVLS off, an NVLink down or the fabric manager?)"
    )
    doc = json.loads((tmp_path / "v2.json").read_text())
    assert doc["baseline"] == {"file": str(baseline), "fraction": 0.9}
    assert doc["nodes"]["dgx02"]["floor_sources"]["node"] == "baseline: 0.9 x 471 GB/s (node dgx02)"
    # a node the baseline does not name is held to its platform's median
    other = fabric.verdict(
        _dgx_job(tmp_path / "3", ("dgx07",), **{"node-dgx07.json": _allreduce(8, 400.0, True)}),
        ["dgx07"],
        "v3",
        fabric.Settings(baseline=recorded, fraction=0.9),
    )
    assert other["nodes"]["dgx07"]["floor_sources"]["node"] == "baseline: 0.9 x 471 GB/s (platform h100-sxm-8)"
    # an explicit --floor wins over the baseline
    floored = fabric.verdict(
        later,
        ["dgx01", "dgx02"],
        "v2",
        fabric.Settings(floors=fabric.parse_floors(["node=390"]), baseline=recorded, fraction=0.9),
    )
    assert floored["ok"], floored["problems"]


def test_a_baseline_is_not_recorded_from_a_run_with_problems(tmp_path, capsys):
    folder = _dgx_job(tmp_path, **{"node-dgx02.json": _allreduce(8, 150.0, gpus=True)})
    code = cli.main(
        [
            "validate",
            str(folder),
            "--nodes",
            "dgx01,dgx02",
            "--run-id",
            "v1",
            "--out",
            str(tmp_path / "v.json"),
            "--record-baseline",
            str(tmp_path / "b.json"),
        ]
    )
    assert code == 1 and "not written" in capsys.readouterr().out and not (tmp_path / "b.json").exists()


# ----------------------------------------------------------------------------- what the report and CLI show


def test_a_node_that_wrote_nothing_is_reported_with_its_logs_last_line(tmp_path):
    folder = _cpu_job(
        tmp_path, **{"node-b.json": None, "node-b.log": "starting\nRuntimeError: gloo: connection refused\n\n"}
    )
    doc = fabric.verdict(folder, ["a", "b", "c"], "v1")
    assert doc["problems"][:2] == [
        "b: all-reduce of two CPU processes: no result: RuntimeError: gloo: connection refused",
        "c: all-reduce of two CPU processes: no result: no node-c.json and no node-c.log",
    ]


def test_wrong_results_fail_a_check_even_above_its_floor(tmp_path):
    folder = _cpu_job(tmp_path, **{"node-a.json": _allreduce(wrong=3), "nodes.json": _allreduce(4, wrong=1)})
    doc = fabric.verdict(folder, ["a", "b"], "v1")
    assert doc["problems"] == [
        "a: all-reduce of two CPU processes: 3 wrong elements (busbw 0.2 GB/s, floor 0.01 GB/s)",
        "all nodes: 4 ranks: 1 wrong elements (busbw 0.2 GB/s, floor 0.01 GB/s)",
    ]


def test_the_report_renders_the_written_validate_json(tmp_path, capsys):
    folder = _dgx_job(tmp_path, **{"node-dgx02.json": _allreduce(8, 150.0, gpus=True)})
    out = tmp_path / "run" / "validate.json"
    code = cli.main(["validate", str(folder), "--nodes", "dgx01,dgx02", "--run-id", "v1", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert code == 1 and printed[-1] == f"validate: failed (1 problem); every figure: {out}"
    text = report.build([str(out)], str(tmp_path / "run")).read_text()
    assert "## Fabric validation" in text and "Verdict: failed." in text
    assert "| GPUs 0,1,2,3,4,5,6,7 | dgx02 | 8 | 150 | 376 | failed: below |" in text
    assert "| all nodes | dgx01, dgx02 | 16 | 381 | 300.8 | held |" in text
    assert "| dgx01 | 8 | h100-sxm-8 | held | 0 |" in text
    assert problems(text) == []


@pytest.mark.parametrize(
    "extra, names",
    [
        (["--floor", "gpu=200"], "unknown key 'gpu'"),
        (["--floor", "nodes=fast"], "'fast' is not a number"),
        (["--floor", "nodes=-1"], "not a finite number >= 0"),
        (["--floor", "zz:nodes=1"], "'zz' is not one of --nodes"),
        (["--expect", "xid_max=many"], "'many' is not valid for xid_max"),
        (["--expect", "colour=red"], "unknown key 'colour'"),
        (["--baseline", "/nonexistent/b.json"], "--baseline '/nonexistent/b.json': cannot read it"),
        (["--baseline", "BAD"], "not a baseline"),
        (["--baseline-fraction", "1.5"], "--baseline-fraction '1.5': expected a number in (0, 1]"),
        (["--nodes", "a,,b"], "--nodes 'a,,b'"),
        (["--nodes", "a,a"], "a node is named twice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, names):
    bad = tmp_path / "BAD"
    bad.write_text('{"check": "validate"}')
    extra = [str(bad) if item == "BAD" else item for item in extra]
    args = [
        "validate",
        str(_cpu_job(tmp_path)),
        "--nodes",
        "a,b",
        "--run-id",
        "v1",
        "--out",
        str(tmp_path / "v.json"),
        *extra,
    ]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and not (tmp_path / "v.json").exists()


def test_a_folder_that_does_not_exist_is_one_line_and_exit_2(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert cli.main(["validate", str(missing), "--nodes", "a", "--run-id", "v1", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such folder" in err and str(missing) in err


def test_verdict_refuses_an_unknown_floor_key_from_python_too():
    with pytest.raises(LabError, match="unknown key 'gpu'"):
        fabric.parse_floors(["gpu=1"])


def test_a_gpu_node_whose_step_saw_no_gpu_fails_by_name_instead_of_passing_as_a_cpu(tmp_path):
    """A job that asked for no GPUs on DGX nodes under ConstrainDevices: nvidia-smi finds no device, the all-reduce
    ran as two CPU processes, and a CPU's floor would pass it. The driver's own list (procfs) and Slurm's Gres
    (--expect gpus=8, from slurm/validate.sbatch) say the node has 8: it fails, naming them."""
    hidden = {"nvidia_smi_gpus": ("No devices were found\n", 6), "nvidia_smi_topo": ("No devices were found\n", 6)}
    folder = _dgx_job(tmp_path, facts={"dgx02": hidden}, **{"node-dgx02.json": _allreduce()})
    doc = fabric.verdict(folder, ["dgx01", "dgx02"], "v1", fabric.Settings(expect=fabric.parse_expect(["gpus=8"])))
    [problem] = [p for p in _only(doc) if "gpus:" in p]
    assert problem.startswith(
        "dgx02: gpus: the node has 8 GPU(s) (8 in Slurm's Gres, 8 in the driver's /proc/driver/nvidia/gpus) but its "
        "step saw 0, so nothing of them was tested: ask the job for them (sbatch --gpus-per-node=8)"
    )
    assert not doc["ok"] and {c["name"]: c["verdict"] for c in doc["nodes"]["dgx02"]["checks"]}["gpus"] == "failed"
    # Slurm's word alone (no driver on the node that ran the facts: the test cluster's fake GPUs) is enough
    cpu = fabric.verdict(
        _cpu_job(tmp_path / "slurm"), ["a", "b"], "v2", fabric.Settings(expect=fabric.parse_expect(["b:gpus=2"]))
    )
    assert [p for p in cpu["problems"] if "gpus:" in p] == [
        "b: gpus: the node has 2 GPU(s) (2 in Slurm's Gres) but its step saw 0, so nothing of them was tested: ask the "
        "job for them (sbatch --gpus-per-node=2), or mend what hides them (ConstrainDevices, a container without "
        "--gpus, a CPU build of torch)"
    ]


def test_the_transport_comes_from_the_ports_link_layer_roce_is_judged_as_rdma_and_efa_is_said(tmp_path):
    """A DGX H100 on Spectrum-X/RoCE has its ConnectX ports on the Ethernet link layer: judged as its RDMA fabric
    (rate, state; NCCL logs RoCE channels as NET/IB, so GPUDirect RDMA is read the same way), not failed as "no
    InfiniBand port". AWS's EFA devices are named efa_N: said, and left to the all-nodes floor."""
    ib = (FIXTURES / "h100" / "ib-width.txt").read_text()
    ibstat = (FIXTURES / "h100" / "ibstat.txt").read_text()
    roce = {"ib_width": ib.replace("InfiniBand", "Ethernet"), "ibstat": ibstat.replace("InfiniBand", "Ethernet")}
    doc = fabric.verdict(_dgx_job(tmp_path, facts={"dgx02": roce}), ["dgx01", "dgx02"], "v1")
    assert _only(doc) == [], doc["problems"]
    checks = {c["name"]: c for c in doc["nodes"]["dgx02"]["checks"]}
    rdma = checks["infiniband"]  # the node's two storage ports are Ethernet too: named beyond the eight, not failed
    assert rdma["verdict"] == "held"
    assert rdma["detail"].startswith("8 of 8 expected port(s) Active at 400 Gb/s 4X (RoCE,")
    assert checks["gdrdma"]["verdict"] == "held"  # judged from NCCL's log, as on InfiniBand
    efa = "".join(
        f"efa_{i} port 1: state=4: ACTIVE; phys_state=5: LinkUp; rate=100 Gb/sec (4X EDR); link_layer=Unspecified\n"
        for i in range(4)
    )
    doc = fabric.verdict(
        _dgx_job(tmp_path / "2", facts={"dgx02": {"ib_width": efa, "ibstat": ("ibstat: not installed\n", 127)}}),
        ["dgx01", "dgx02"],
        "v1",
    )
    assert _only(doc) == [], doc["problems"]
    said = {c["name"]: c for c in doc["nodes"]["dgx02"]["checks"]}["infiniband"]
    assert said["verdict"] == "not applicable" and said["detail"].startswith("transport EFA (efa_N devices)")


def test_a_node_whose_nccl_did_not_use_nvls_is_judged_at_the_rings_figure_not_failed_at_nvls(tmp_path):
    """376 GB/s (0.8 of 470, with NVLS) sits inside a healthy H100 node's range without NVLS (~370: NCCL's ring
    over NVLink 4). Which one applies is read from NCCL's log of the node's all-reduce."""
    ring_log = "dgx02:4242:4250 [0] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7\n"
    files = {"node-dgx02.json": _allreduce(8, 350.0, gpus=True), "node-dgx02.log": ring_log}
    doc = fabric.verdict(_dgx_job(tmp_path, **files), ["dgx01", "dgx02"], "v1")
    assert _only(doc) == [], doc["problems"]
    record = doc["nodes"]["dgx02"]
    assert record["floors"]["node"] == pytest.approx(296.0) and "without NVLS" in record["floor_sources"]["node"]
    assert {c["name"]: c["verdict"] for c in record["checks"]}["nvls"] == "not applicable"
    # the same figure where NCCL did set up NVLS: far from its health, and failed
    files["node-dgx02.log"] = NVLS_LOG.format(node="dgx02")
    doc = fabric.verdict(_dgx_job(tmp_path / "2", **files), ["dgx01", "dgx02"], "v1")
    assert any("350" in p and "376" in p for p in _only(doc)), doc["problems"]
