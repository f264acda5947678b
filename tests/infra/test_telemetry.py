"""The telemetry role: every rank's metrics target gathered on the controller into one file_sd file.

The real `ansible-playbook` runs only the telemetry play (and the always-tagged one that resolves the job's
variables) on the two local "nodes" of playbooks/inventory/local.yml; what it writes is checked against
what the ranks' own exporters would publish on those nodes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from lab.run.config import MetricsConfig
from lab.run.observability import metrics
from tests.conftest import ROOT
from tests.infra.test_ansible import LOCAL, NODES, _playbook

ROLE = ROOT / "playbooks" / "roles" / "telemetry"


def _free_port_on_both_nodes() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.2", port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on both 127.0.0.1 and 127.0.0.2")


class _Rank:
    """The torchrun layout of a rank of the local two-node job: one worker per node."""

    local_rank, local_world_size, world_size = 0, 1, 2

    def __init__(self, global_rank: int) -> None:
        import torch

        self.global_rank, self.device = global_rank, torch.device("cpu")


def test_the_controller_lists_every_rank_as_the_ranks_themselves_would(tmp_path, monkeypatch):
    port_base = _free_port_on_both_nodes()
    central = tmp_path / "prometheus-targets"
    central.mkdir()
    proc, recap = _playbook(
        tmp_path, LOCAL, "--tags", "telemetry", lab_metrics_port_base=port_base, lab_prometheus_targets_dir=str(central)
    )
    assert set(recap) == set(NODES) and all(r["failed"] == 0 for r in recap.values()), proc.stdout

    record = tmp_path / "controller" / "job1" / "targets.json"
    targets = json.loads(record.read_text())
    # Both nodes' ranks in rank order, on the node addresses (the launch role binds the exporters there)
    assert [(t["targets"], t["labels"]["rank"]) for t in targets] == [
        ([f"{node}:{port_base}"], str(rank)) for rank, node in enumerate(NODES)
    ]
    # ... and exactly what the ranks' exporters publish: what rank 0 gathers into its own file_sd file.
    # The launch role passes each node's lab_node_address as metrics.bind_address; the head is 127.0.0.1.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    exporters = [
        metrics.start(MetricsConfig(port_base=port_base, bind_address=node), _Rank(rank), "job1", {})
        for rank, node in enumerate(NODES)
    ]
    try:
        published = [exporter.target() for exporter in exporters]
    finally:
        for exporter in exporters:
            exporter.close()
    assert targets == published and set(targets[0]["labels"]) == set(metrics.LABELS)
    metrics.write_targets(tmp_path / "rank0.json", published)  # rank 0's writer, byte for byte
    assert record.read_bytes() == (tmp_path / "rank0.json").read_bytes()
    # The central Prometheus's copy, where the shipped prometheus.yml's lab job globs
    assert (central / "job1.json").read_bytes() == record.read_bytes()
    assert sorted(p.name for p in central.iterdir()) == ["job1.json"]  # no exporter targets on runtime process

    # Runtime process: no exporter container, and each node says why
    for node in NODES:
        assert f"{node}: node-exporter and dcgm-exporter skipped: lab_runtime is process" in proc.stdout


def test_the_exporters_match_compose_and_the_central_prometheus_globs():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert defaults["telemetry_node_exporter_image"] == services["node-exporter"]["image"]
    # compose's default dcgm-exporter is the role's image for DCGM 4 (overridable with LAB_DCGM_EXPORTER_IMAGE);
    # each image's tag starts with the DCGM major version it is chosen for
    dcgm = services["dcgm-exporter"]
    assert dcgm["image"] == "${LAB_DCGM_EXPORTER_IMAGE:-" + defaults["telemetry_dcgm_exporter_images"]["4"] + "}"
    assert all(
        image.split(":")[1].startswith(major + ".")
        for major, image in defaults["telemetry_dcgm_exporter_images"].items()
    )
    # no SYS_ADMIN under compose: its counters file has no profiling field, the only ones that need it
    assert "cap_add" not in dcgm and dcgm["command"] == ["-f", "/etc/lab/dcgm-counters.csv"]
    assert "./monitoring/dcgm/counters.csv:/etc/lab/dcgm-counters.csv:ro" in dcgm["volumes"]
    assert dcgm["environment"] == {"DCGM_REMOTE_HOSTENGINE_INFO": None}  # passed through only when set
    # the role writes targets/<job>/<node>.json; prometheus.yml's node and dcgm jobs glob there
    jobs = {
        j["job_name"]: j for j in yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())["scrape_configs"]
    }
    exporters = (ROLE / "tasks" / "exporters.yml").read_text()
    for job, folder in (("node", "node-exporter"), ("dcgm-exporter", "dcgm-exporter")):
        assert f"job: {folder}" in exporters
        assert jobs[job]["file_sd_configs"][0]["files"] == [f"targets/{folder}/*.json"]


# A stand-in for the Docker CLI (no Docker engine on the test machines): it keeps containers in a JSON file
# and logs every call, enough for the role's inspect / rm / run.
FAKE_DOCKER = """#!{python}
import json, sys
from pathlib import Path
state_file, log = Path({state!r}), Path({log!r})
state = json.loads(state_file.read_text()) if state_file.exists() else {{}}
args = sys.argv[1:]
with log.open("a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:2] == ["container", "inspect"]:
    if args[2] not in state:
        sys.exit(f"Error: No such container: {{args[2]}}")
    print(json.dumps([{{"State": {{"Running": True}}, "Config": {{"Labels": state[args[2]]["labels"]}}}}]))
elif args[:2] == ["rm", "--force"]:
    state.pop(args[2], None)
elif args[0] == "run":
    name, label = args[args.index("--name") + 1], args[args.index("--label") + 1]
    state[name] = {{"labels": dict([label.split("=", 1)]), "argv": args}}
    print("0123456789ab")
else:
    sys.exit(f"fake docker: unexpected {{args}}")
state_file.write_text(json.dumps(state))
"""


def test_exporter_containers_are_replaced_when_stale_and_left_alone_when_current(tmp_path, monkeypatch):
    bin_dir, state, log = tmp_path / "bin", tmp_path / "docker-state.json", tmp_path / "docker.log"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER.format(python=sys.executable, state=str(state), log=str(log)))
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    # an older node-exporter of ours is running (another image: another spec)
    state.write_text(json.dumps({"lab-node-exporter": {"labels": {"lab.telemetry.spec": "old"}}}))
    central = tmp_path / "prometheus-targets"
    central.mkdir()
    port = _free_port_on_both_nodes()
    gpus = Path("/dev/nvidiactl").exists()  # dcgm-exporter only where there is an NVIDIA driver

    def play() -> tuple[dict, list[list[str]]]:
        log.unlink(missing_ok=True)
        proc, recap = _playbook(
            tmp_path,
            LOCAL,
            "--tags",
            "telemetry",
            "--limit",
            "127.0.0.1",
            lab_runtime="docker",
            lab_prometheus_targets_dir=str(central),
            telemetry_node_exporter_port=port,
        )
        assert recap["127.0.0.1"]["failed"] == 0, proc.stdout
        assert "no per-rank metrics targets: metrics are off (lab_metrics_port_base is 0)" in proc.stdout
        return recap["127.0.0.1"], [json.loads(line) for line in log.read_text().splitlines()]

    recap, calls = play()
    runs = [c for c in calls if c[0] == "run"]
    assert ["rm", "--force", "lab-node-exporter"] in calls and len(runs) == 1 + gpus
    node_exporter = runs[0]
    assert node_exporter[:6] == ["run", "--detach", "--restart", "unless-stopped", "--name", "lab-node-exporter"]
    assert node_exporter[8:] == [
        "--network",
        "host",
        "--pid",
        "host",
        "--volume",
        "/:/host:ro,rslave",
        "prom/node-exporter:v1.8.2",
        "--path.rootfs=/host",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    files = {p.relative_to(central).as_posix(): json.loads(p.read_text()) for p in central.rglob("*.json")}
    assert files["node-exporter/127.0.0.1.json"] == [
        {"targets": [f"127.0.0.1:{port}"], "labels": {"node": socket.gethostname()}}
    ]
    assert set(files) == {"node-exporter/127.0.0.1.json"} | ({"dcgm-exporter/127.0.0.1.json"} if gpus else set())

    # Again: everything is as specified, so nothing is removed or started and nothing changes
    recap, calls = play()
    assert recap["changed"] == 0 and not [c for c in calls if c[0] in ("run", "rm")], calls


def _fields(path: Path) -> list[str]:
    return [line.split(",")[0].strip() for line in path.read_text().splitlines() if line.strip() and line[0] != "#"]


def test_the_counters_files_collect_every_field_the_rules_and_dashboard_name():
    import re

    dcgm = ROOT / "monitoring" / "dcgm"
    plain, profiling = _fields(dcgm / "counters.csv"), _fields(dcgm / "counters-profiling.csv")
    named = set()
    for path in [
        *(ROOT / "monitoring" / "rules").glob("*.yml"),
        ROOT / "monitoring" / "grafana" / "dashboards" / "lab.json",
    ]:
        named |= set(re.findall(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+", path.read_text()))
    assert {"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"} <= named
    assert named <= set(plain), named - set(plain)
    assert not [f for f in plain if f.startswith("DCGM_FI_PROF_")]  # no field that needs SYS_ADMIN
    assert profiling[: len(plain)] == plain and {f for f in profiling[len(plain) :]} == {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    }


# `dcgmi -v` as DCGM prints it (its dcgmi/Version.cpp; the layout of NVIDIA/DCGM issue 183): the client's build,
# then, when a host engine answers, the engine's.
DCGMI = """Version : {client}
Build ID : 26
Build Date : 2024-07-09
Build Type : Release
Commit ID : 105620196e46a7ef2f99a1ce3e69a5d12af1e845
Branch Name : rel_dcgm_3_3
CPU Arch : x86_64
Build Platform : Linux 4.15.0-180-generic #189-Ubuntu SMP Wed May 18 14:13:57 UTC 2022 x86_64
CRC : c1b74febf52d45d29ae956b78c091857
{engine}"""


def _fake_gpu_node(tmp_path: Path, monkeypatch, dcgmi: str | None, hostengine: bool) -> tuple[Path, Path]:
    """A node with an NVIDIA device file, the fake Docker CLI, and `dcgmi` and `pgrep` stand-ins (no GPU, DCGM
    or Docker engine on the test machines): returns (the device file, docker's call log)."""
    bin_dir, state, log = tmp_path / "bin", tmp_path / "docker-state.json", tmp_path / "docker.log"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER.format(python=sys.executable, state=str(state), log=str(log)))
    (bin_dir / "pgrep").write_text(f"#!/bin/sh\nexit {0 if hostengine else 1}\n")
    scripts = ["docker", "pgrep"]
    if dcgmi is not None:
        (tmp_path / "dcgmi.out").write_text(dcgmi)
        (bin_dir / "dcgmi").write_text(f"#!/bin/sh\ncat {tmp_path / 'dcgmi.out'}\n")
        scripts.append("dcgmi")
    for name in scripts:
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    device = tmp_path / "nvidiactl"
    device.write_text("")
    return device, log


def _dcgm_exporter_run(tmp_path: Path, device: Path, log: Path, **extra) -> tuple[list[str], str]:
    log.unlink(missing_ok=True)
    ports: dict[str, Any] = {
        "telemetry_node_exporter_port": _free_port_on_both_nodes(),
        "telemetry_dcgm_exporter_port": _free_port_on_both_nodes(),
    }
    proc, recap = _playbook(
        tmp_path,
        LOCAL,
        "--tags",
        "telemetry",
        "--limit",
        "127.0.0.1",
        lab_runtime="docker",
        telemetry_nvidia_device=str(device),
        **ports,
        **extra,
    )
    assert recap["127.0.0.1"]["failed"] == 0, proc.stdout
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    runs = [c for c in calls if c[0] == "run" and "lab-dcgm-exporter" in c]
    return (runs[0] if runs else []), proc.stdout


def test_dcgm_exporter_matches_the_hosts_dcgm_and_reads_its_host_engine(tmp_path, monkeypatch):
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    images = defaults["telemetry_dcgm_exporter_images"]
    workdir = tmp_path / "nodes" / "127.0.0.1"

    # DCGM 3 with nv-hostengine running (DGX OS's nvidia-dcgm.service): the 3.x image, connected to that engine
    # (-r), no second engine; no SYS_ADMIN, the counters file without profiling fields
    engine = "\nHostengine build info:\n" + DCGMI.format(client="3.3.7", engine="")
    device, log = _fake_gpu_node(tmp_path, monkeypatch, DCGMI.format(client="3.3.7", engine=engine), hostengine=True)
    argv, _ = _dcgm_exporter_run(tmp_path, device, log)
    assert images["3"] in argv and "SYS_ADMIN" not in argv, argv
    assert argv[argv.index(images["3"]) + 1 :][:2] == ["-f", "/etc/lab/dcgm-counters.csv"]
    assert argv[-2:] == ["--remote-hostengine-info", "localhost:5555"]
    assert f"{workdir}/telemetry/counters.csv:/etc/lab/dcgm-counters.csv:ro" in argv
    assert (workdir / "telemetry" / "counters.csv").read_bytes() == (ROOT / "monitoring/dcgm/counters.csv").read_bytes()

    # The engine's version decides when the client's differs (the last Version line); profiling asked for:
    # SYS_ADMIN with the profiling counters file, and the container replaced (another spec)
    engine = "\nHostengine build info:\n" + DCGMI.format(client="4.1.1", engine="")
    (tmp_path / "dcgmi.out").write_text(DCGMI.format(client="3.3.7", engine=engine))
    argv, _ = _dcgm_exporter_run(tmp_path, device, log, telemetry_dcgm_profiling=True)
    assert images["4"] in argv and argv[argv.index("--cap-add") + 1] == "SYS_ADMIN", argv
    assert f"{workdir}/telemetry/counters-profiling.csv:/etc/lab/dcgm-counters.csv:ro" in argv


def test_dcgm_exporter_without_host_dcgm_embeds_its_engine_and_an_unknown_dcgm_is_named(tmp_path, monkeypatch):
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    device, log = _fake_gpu_node(tmp_path, monkeypatch, None, hostengine=False)
    argv, _ = _dcgm_exporter_run(tmp_path, device, log)
    assert defaults["telemetry_dcgm_exporter_images"]["4"] in argv and "--remote-hostengine-info" not in argv, argv

    device, log = _fake_gpu_node(tmp_path, monkeypatch, DCGMI.format(client="5.0.0", engine=""), hostengine=False)
    argv, stdout = _dcgm_exporter_run(tmp_path, device, log)
    assert argv == []
    assert (
        "127.0.0.1: dcgm-exporter not started: `dcgmi -v` says DCGM 5.0.0, and telemetry_dcgm_exporter_images "
        "has no image for major version 5"
    ) in stdout


def test_targets_are_withdrawn_as_the_workers_exit_before_collect_and_report(tmp_path):
    """The whole play on the two local nodes: when collect runs `lab report`, the central Prometheus's copy of
    the run's targets is gone already (a stand-in for the controller's lab notes what it sees, then runs the
    real one)."""
    central = tmp_path / "prometheus-targets"
    central.mkdir()
    bin_dir = tmp_path / "controller-bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen-at-report.txt"
    lab_bin = Path(sys.executable).parent / "lab"
    (bin_dir / "lab").write_text(f'#!/bin/sh\nls -A {central} > {seen}\nexec {lab_bin} "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the role's writer runs it
    for name in ("lab", "python"):
        (bin_dir / name).chmod(0o755)
    proc, recap = _playbook(
        tmp_path,
        LOCAL,
        "--tags",
        "telemetry,launch,collect",
        lab_metrics_port_base=_free_port_on_both_nodes(),
        lab_prometheus_targets_dir=str(central),
        lab_controller_lab=str(bin_dir / "lab"),
        preflight_gpu_count=0,
    )  # CPU "nodes"
    assert set(recap) == set(NODES) and all(r["failed"] == 0 for r in recap.values()), proc.stdout[-4000:]
    assert (tmp_path / "controller" / "job1" / "targets.json").exists()  # published before launch
    assert seen.read_text() == ""  # withdrawn before collect's `lab report`
    assert (tmp_path / "controller" / "job1" / "report.md").exists()
