"""A real Docker engine builds the lab image from images/Dockerfile and runs the `lab` service through compose.

No image registry is reachable here, so `scripts/container-base.sh` starts a private dockerd (its own data
root and socket, no iptables, no default bridge) and makes the base image locally: a debootstrapped Debian
bookworm with python3 and the torch/torchvision of this venv, standing in for the NGC image (which ships
its own torch). Everything after the base is the product's path: compose builds images/Dockerfile with
BASE_IMAGE overridden (dependencies from PyPI, the lab as a wheel, the non-root user, the entry point),
`compose up lab` runs it with compose.yaml + compose.cpu.yaml and a small override that only swaps the
workshop for a smoke run and drops the monitoring services, which would need images from a registry.
The Python `docker` SDK (the product's engine client) inspects the image and the container.

Cold (CI: apt-get, debootstrap, docker import of ~5 GB of torch) about 3.5 minutes on 2 cores; with the data
root of the engine cached in build/container/ 30-60 s. Skips, with the reason, only where the engine cannot run
(not root, no apt-get): `make test-container` runs just this file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run

docker = pytest.importorskip("docker", reason="the Python docker SDK is in the test extra: pip install -e '.[test]'")

COMPOSE = str(Path(sys.executable).parent / "docker-compose")
STATE = ROOT / "build" / "container"
IMAGE = "local/lab:test"
LAB_UID = 1000
SMOKE = ["train", "--config", "smoke", "--set", "model.width=8", "--set", "run.id=container-smoke",
         "--set", "metrics.port_base=9500", "--set", "metrics.bind_address=0.0.0.0",
         "--set", "metrics.pushgateway=pushgateway:9091", "--set", "metrics.targets_dir=/lab/targets"]

# compose.yaml asks for memlock -1 (NCCL pins memory). Raising a hard limit needs CAP_SYS_RESOURCE, which
# GPU servers' engines have and this machine's does not (hard limit 8 MiB here): then the test asks for the
# hard limit the machine has, and says so.
_HARD_MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
MEMLOCK = -1 if _HARD_MEMLOCK == resource.RLIM_INFINITY else _HARD_MEMLOCK

# The test's only changes to the shipped files: a smoke run instead of the workshop, no monitoring services
# (their images would come from a registry), the local image name, build steps on the host network (the
# engine has no default bridge; pip reaches PyPI through the host), and memlock where the machine caps it.
OVERRIDE = f"""
services:
  lab-init:
    image: {IMAGE}
  lab:
    image: {IMAGE}
    build:
      network: host
    command: {json.dumps(SMOKE)}
    depends_on: !override
      lab-init:
        condition: service_completed_successfully
""" + ("" if MEMLOCK == -1 else f"""\
    ulimits:
      memlock: {{soft: {MEMLOCK}, hard: {MEMLOCK}}}
""")


@pytest.fixture(scope="module")
def engine():
    """DOCKER_HOST and BASE_IMAGE of a private engine; one test session at a time per checkout."""
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another `make test` in this checkout waits here
        started = time.monotonic()
        proc = subprocess.run([str(ROOT / "scripts" / "container-base.sh"), "start"], capture_output=True,
                              text=True, timeout=1200)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 77:
            pytest.skip(lines[-1] if lines else "container-base.sh: this machine cannot run a Docker engine")
        if proc.returncode != 0:
            raise AssertionError(f"container-base.sh start exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        env = dict(line.split("=", 1) for line in lines[-2:])
        print(f"engine and base image ready in {time.monotonic() - started:.0f} s: {env}")
        if MEMLOCK != -1:
            print(f"note: this machine's hard memlock limit is {MEMLOCK} bytes and its engine cannot raise it "
                  f"(no CAP_SYS_RESOURCE): the lab runs with memlock {MEMLOCK} instead of compose.yaml's -1")
        try:
            yield env
        finally:
            subprocess.run([str(ROOT / "scripts" / "container-base.sh"), "stop"], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def client(engine):
    c = docker.DockerClient(base_url=engine["DOCKER_HOST"])
    yield c
    c.close()


@pytest.fixture(scope="module")
def revision() -> str:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "test-revision"


@pytest.fixture(scope="module")
def project(engine, client, revision, tmp_path_factory):
    """The compose project: files, environment, and host folders for ./runs and ./data (root-owned 0755,
    as Docker would create them, so lab-init has to make them writable for the lab user)."""
    work = tmp_path_factory.mktemp("compose")
    (work / "override.yaml").write_text(OVERRIDE)
    for name in ("runs", "data"):
        (work / name).mkdir(mode=0o755)
    env = {
        "DOCKER_HOST": engine["DOCKER_HOST"], "BASE_IMAGE": engine["BASE_IMAGE"], "LAB_IMAGE": IMAGE,
        "LAB_REVISION": revision, "LAB_RUNS_DIR": str(work / "runs"), "LAB_DATA_DIR": str(work / "data"),
        "COMPOSE_PROJECT_NAME": "labtest", "DOCKER_BUILDKIT": "0",
    }
    files = ["-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "compose.cpu.yaml"), "-f", str(work / "override.yaml")]

    def compose(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
        return run([COMPOSE, *files, *args], env=env, timeout=timeout)

    started = time.monotonic()
    compose("build", "lab")
    print(f"image built in {time.monotonic() - started:.0f} s")
    yield {"compose": compose, "work": work, "env": env}
    compose("down", "--volumes", "--remove-orphans", timeout=120)


@pytest.fixture(scope="module")
def smoke_run(project, client):
    """`compose up lab`: lab-init, then the smoke run; then `lab report` on it through `compose run`."""
    started = time.monotonic()
    up = project["compose"]("up", "--no-build", "lab")
    container = client.containers.list(all=True, filters={"label": ["com.docker.compose.project=labtest",
                                                                    "com.docker.compose.service=lab"]})[0]
    run_dir = project["work"] / "runs" / "container-smoke"
    report = project["compose"]("run", "--rm", "--no-deps", "lab", "report", "runs/container-smoke")
    print(f"compose up + report in {time.monotonic() - started:.0f} s")
    return {"up": up, "container": container, "run_dir": run_dir, "report": report}


def test_image_is_built_by_the_normal_path(project, client, engine, revision):
    image = client.images.get(IMAGE)
    config = image.attrs["Config"]
    assert config["Entrypoint"] == ["/usr/local/bin/lab-entrypoint"]  # images/entrypoint.sh: NGC's first, then lab
    assert config["Cmd"] == ["workshop"]
    assert config["User"] == str(LAB_UID)
    assert config["Healthcheck"]["Test"] == ["CMD", "lab", "--version"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.revision"] == revision
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.base.name"] == engine["BASE_IMAGE"]
    assert "org.opencontainers.image.source" in labels
    # The healthcheck's command works as the image's user, and the base's torch was kept, not replaced.
    out = client.containers.run(IMAGE, ["--version"], remove=True).decode()
    assert out.strip() == "lab 0.1.0"
    # pynvml: the image installs the `gpu` extra (per-GPU metrics by UUID); importing it needs no driver.
    probe = ("import os, torch, lab, pynvml; print(os.getuid(), torch.__version__, torch.__file__)")
    out = client.containers.run(IMAGE, ["-c", probe], entrypoint=["python3"], remove=True).decode().split()
    assert out[0] == str(LAB_UID)
    assert out[1].startswith("2.14.1") and out[2].startswith("/opt/venv/"), out


def test_compose_up_lab_leaves_the_run_on_the_host(smoke_run):
    container = smoke_run["container"]
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode()[-4000:]
    host = container.attrs["HostConfig"]
    assert host["Init"] is True
    assert host["IpcMode"] == "host"
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]} == {
        "memlock": (MEMLOCK, MEMLOCK), "stack": (67108864, 67108864)}

    run_dir = smoke_run["run_dir"]
    for name in ("manifest.json", "metrics.jsonl", "summary.json", "report.md"):
        assert (run_dir / name).is_file(), f"{name} missing from {run_dir}: {sorted(os.listdir(run_dir))}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    losses = [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "train"]
    assert len(losses) >= 4 and losses[-1] < losses[0], losses
    report = (run_dir / "report.md").read_text()
    pngs = re.findall(r"\((\S+\.png)\)", report)
    assert "container-smoke" in report and pngs and all((run_dir / png).is_file() for png in pngs), report


def test_the_lab_ran_as_the_non_root_user(smoke_run):
    run_dir = smoke_run["run_dir"]
    owners = {p.name: p.stat().st_uid for p in [run_dir, *run_dir.iterdir()]}
    assert set(owners.values()) == {LAB_UID}, owners
    assert smoke_run["container"].attrs["Config"]["User"] == str(LAB_UID)


def test_manifest_and_targets_match_the_compose_wiring(smoke_run, revision):
    run_dir = smoke_run["run_dir"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["git_revision"] == revision  # LAB_GIT_REVISION, baked from the build argument
    assert manifest["hosts"] == ["lab"]  # compose's hostname
    # The base image's Python and torch ran it (Debian's 3.11.2, the base's torch kept by the Dockerfile).
    assert manifest["versions"]["python"] == "3.11.2" and manifest["versions"]["torch"].startswith("2.14.1")
    # Prometheus (same compose network) resolves the service name `lab`: the file_sd entry must say lab:9500.
    targets = json.loads((run_dir / "prometheus-targets.json").read_text())
    assert targets[0]["targets"] == ["lab:9500"]
    assert targets[0]["labels"]["node"] == "lab"
    # No Pushgateway runs in this test: the run warns once and still completes.
    logs = smoke_run["container"].logs().decode()
    assert logs.count("could not push") == 1, logs[-3000:]
