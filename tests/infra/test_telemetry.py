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

import yaml

from lab.observability import metrics
from lab.config import MetricsConfig
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
    proc, recap = _playbook(tmp_path, LOCAL, "--tags", "telemetry", lab_metrics_port_base=port_base,
                            lab_prometheus_targets_dir=str(central))
    assert set(recap) == set(NODES) and all(r["failed"] == 0 for r in recap.values()), proc.stdout

    record = tmp_path / "controller" / "job1" / "targets.json"
    targets = json.loads(record.read_text())
    # Both nodes' ranks in rank order, on the node addresses (the launch role binds the exporters there)
    assert [(t["targets"], t["labels"]["rank"]) for t in targets] == [([f"{node}:{port_base}"], str(rank))
                                                                     for rank, node in enumerate(NODES)]
    # ... and exactly what the ranks' exporters publish: what rank 0 gathers into its own file_sd file.
    # The launch role passes each node's lab_node_address as metrics.bind_address; the head is 127.0.0.1.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    exporters = [metrics.start(MetricsConfig(port_base=port_base, bind_address=node), _Rank(rank), "job1", {})
                 for rank, node in enumerate(NODES)]
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
    assert defaults["telemetry_dcgm_exporter_image"] == services["dcgm-exporter"]["image"]
    # the role writes targets/<job>/<node>.json; prometheus.yml's node and dcgm jobs glob there
    jobs = {j["job_name"]: j for j in yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
            ["scrape_configs"]}
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
        proc, recap = _playbook(tmp_path, LOCAL, "--tags", "telemetry", "--limit", "127.0.0.1", lab_runtime="docker",
                                lab_prometheus_targets_dir=str(central), telemetry_node_exporter_port=port)
        assert recap["127.0.0.1"]["failed"] == 0, proc.stdout
        assert "no per-rank metrics targets: metrics are off (lab_metrics_port_base is 0)" in proc.stdout
        return recap["127.0.0.1"], [json.loads(line) for line in log.read_text().splitlines()]

    recap, calls = play()
    runs = [c for c in calls if c[0] == "run"]
    assert ["rm", "--force", "lab-node-exporter"] in calls and len(runs) == 1 + gpus
    node_exporter = runs[0]
    assert node_exporter[:6] == ["run", "--detach", "--restart", "unless-stopped", "--name", "lab-node-exporter"]
    assert node_exporter[8:] == ["--network", "host", "--pid", "host", "--volume", "/:/host:ro,rslave",
                                 "prom/node-exporter:v1.8.2", "--path.rootfs=/host",
                                 f"--web.listen-address=127.0.0.1:{port}"]
    files = {p.relative_to(central).as_posix(): json.loads(p.read_text()) for p in central.rglob("*.json")}
    assert files["node-exporter/127.0.0.1.json"] == [{"targets": [f"127.0.0.1:{port}"],
                                                      "labels": {"node": socket.gethostname()}}]
    assert set(files) == {"node-exporter/127.0.0.1.json"} | ({"dcgm-exporter/127.0.0.1.json"} if gpus else set())

    # Again: everything is as specified, so nothing is removed or started and nothing changes
    recap, calls = play()
    assert recap["changed"] == 0 and not [c for c in calls if c[0] in ("run", "rm")], calls
