"""A real Docker engine builds the lab image from images/Dockerfile and runs the `lab` service through compose.

No image registry is reachable here, so `scripts/container-base.sh` starts a private dockerd (its own data
root and socket, no iptables, no default bridge) and makes the base image locally: a debootstrapped Debian
bookworm with python3 and the torch/torchvision of this venv, standing in for the NGC image (which ships
its own torch). Everything after the base is the product's path: compose builds images/Dockerfile with
BASE_IMAGE overridden (dependencies from PyPI, the lab as a wheel, the non-root user, the entry point),
`compose up lab` runs it with compose.yaml + compose.cpu.yaml and a small override that only swaps the
workshop for a smoke run and drops the monitoring services, which would need images from a registry.
The Python `docker` SDK (the product's engine client) inspects the image and the container. Then a workshop
room's seat: compose builds the jupyter image, and `lab room serve --spawner docker` (the hub on this host, with
the real proxy) has DockerSpawner start one seat as a container of it on this engine.

Cold (CI: apt-get, debootstrap, docker import of ~5 GB of torch) about 5 minutes on 2 cores, the jupyter image
about 1 of them; with the data root of the engine cached in build/container/ 30-60 s. Skips, with the reason,
only where the engine cannot run (not root, no apt-get): `make test-container` runs just this file.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, run
from tests.infra import hub_client as hub

docker = pytest.importorskip("docker", reason="the Python docker SDK is in the test extra: pip install -e '.[test]'")

COMPOSE = str(Path(sys.executable).parent / "docker-compose")
STATE = ROOT / "build" / "container"
IMAGE = "local/lab:test"
JUPYTER_IMAGE = "local/lab-jupyter:test"  # the seats' image: images/Dockerfile's jupyter stage
LAB_UID = 1000
SMOKE = [
    "train",
    "--config",
    "smoke",
    "--set",
    "model.width=8",
    "--set",
    "run.id=container-smoke",
    "--set",
    "metrics.port_base=9500",
    "--set",
    "metrics.bind_address=0.0.0.0",
    "--set",
    "metrics.pushgateway=pushgateway:9091",
    "--set",
    "metrics.targets_dir=/lab/targets",
]

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
  jupyter:
    image: {JUPYTER_IMAGE}
    build:
      network: host
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
""" + (
    ""
    if MEMLOCK == -1
    else f"""\
    ulimits:
      memlock: {{soft: {MEMLOCK}, hard: {MEMLOCK}}}
"""
)


@pytest.fixture(scope="module")
def engine():
    """DOCKER_HOST and BASE_IMAGE of a private engine; one test session at a time per checkout."""
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another `make test` in this checkout waits here
        started = time.monotonic()
        proc = subprocess.run(
            [str(ROOT / "scripts" / "container-base.sh"), "start"], capture_output=True, text=True, timeout=1200
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode == 77:
            pytest.skip(lines[-1] if lines else "container-base.sh: this machine cannot run a Docker engine")
        if proc.returncode != 0:
            # an engine that started before the base image failed (a full disk) is stopped, not left running
            subprocess.run([str(ROOT / "scripts" / "container-base.sh"), "stop"], capture_output=True, timeout=60)
            raise AssertionError(f"container-base.sh start exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        env = dict(line.split("=", 1) for line in lines[-2:])
        print(f"engine and base image ready in {time.monotonic() - started:.0f} s: {env}")
        if MEMLOCK != -1:
            print(
                f"note: this machine's hard memlock limit is {MEMLOCK} bytes and its engine cannot raise it "
                f"(no CAP_SYS_RESOURCE): the lab runs with memlock {MEMLOCK} instead of compose.yaml's -1"
            )
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
        "DOCKER_HOST": engine["DOCKER_HOST"],
        "BASE_IMAGE": engine["BASE_IMAGE"],
        "LAB_IMAGE": IMAGE,
        "LAB_REVISION": revision,
        "LAB_RUNS_DIR": str(work / "runs"),
        "LAB_DATA_DIR": str(work / "data"),
        "COMPOSE_PROJECT_NAME": "labtest",
        "DOCKER_BUILDKIT": "0",
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
    container = client.containers.list(
        all=True, filters={"label": ["com.docker.compose.project=labtest", "com.docker.compose.service=lab"]}
    )[0]
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
    probe = "import os, torch, lab, pynvml; print(os.getuid(), torch.__version__, torch.__file__)"
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
        "memlock": (MEMLOCK, MEMLOCK),
        "stack": (67108864, 67108864),
    }

    run_dir = smoke_run["run_dir"]
    for name in ("manifest.json", "metrics.jsonl", "summary.json", "report.md"):
        assert (run_dir / name).is_file(), f"{name} missing from {run_dir}: {sorted(os.listdir(run_dir))}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    losses = [
        r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"
    ]
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


# ------------------------------------------------------------------------------------------ a room's seat
# `lab room serve --spawner docker` (what compose's hub service runs) here on the host, with the real proxy and
# DockerSpawner talking to this engine: one seat, a container of the jupyter image. The hub's own image (the
# jupyter image plus Node.js) is not built here: its apt and npm steps would cost this suite minutes more.
SEAT = "ds1"
PROXY = Path(sys.prefix) / "room-proxy" / "node_modules" / ".bin" / "configurable-http-proxy"


@pytest.fixture(scope="module")
def docker_room(project, client, tmp_path_factory):
    """The jupyter image built by compose (`compose build jupyter`), a bridge network for the hub and the seat
    (the hub's API on its gateway, the host's side of it), and the room serving one seat planned on 2 cores and
    8 GiB."""
    from lab.course.teaching.lesson import free_ports

    if not PROXY.exists():
        reason = f"configurable-http-proxy is not installed ({PROXY}): `make room-proxy` (npm) installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the room's seat must run)", pytrace=False)
        pytest.skip(reason)
    started = time.monotonic()
    project["compose"]("build", "jupyter")
    print(f"jupyter image built in {time.monotonic() - started:.0f} s")
    for left in client.networks.list(names=["labtest-room"]):  # a run killed before its teardown
        left.remove()
    network = client.networks.create("labtest-room", driver="bridge")
    network.reload()
    gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
    state = tmp_path_factory.mktemp("room")
    port = free_ports(3)  # the proxy's public port, the hub's, the proxy's API
    hub_port, api_port = port + 1, port + 2
    command = [
        str(Path(sys.executable).parent / "lab"),
        "room",
        "serve",
        "--spawner",
        "docker",
        "--image",
        JUPYTER_IMAGE,
        "--network",
        network.name,
        "--gpus",
        "0",
        "--seats",
        "1",
        "--cores",
        "2",
        "--memory",
        "8",
        "--prefix",
        SEAT[:-1],
        "--room-dir",
        str(state),
        "--port",
        str(port),
        "--hub-port",
        str(hub_port),
        "--proxy-api-port",
        str(api_port),
        "--hub-bind",
        gateway,
        "--memlock",
        str(MEMLOCK),
        "--idle-timeout",
        "600",
    ]
    log = state.parent / "room.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            command,
            env={**os.environ, "DOCKER_HOST": project["env"]["DOCKER_HOST"]},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # as a terminal starts it, in the foreground: a suite run as a background job (`cmd &` in a script)
            # passes SIGINT on ignored, and the Ctrl-C below would then be a no-op
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    base = f"http://127.0.0.1:{port}"
    try:
        hub.wait_until_serving(base, proc, log)
        yield {"base": base, "state": state, "proc": proc, "log": log}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=90)
        for container in client.containers.list(all=True, filters={"name": f"jupyter-{SEAT}"}):
            container.remove(force=True)
        for volume in client.volumes.list(filters={"name": f"lab-room-{SEAT}"}):
            volume.remove(force=True)
        network.remove()


def test_a_seat_is_a_container_of_the_jupyter_image_with_its_cores_memory_and_volume(docker_room, client):
    """A learner signs up, the instructor authorizes, the seat's server starts: DockerSpawner made a container
    of the lab's jupyter image with the plan's cores, memory and volume; through the proxy the seat lists each
    lesson once, and its kernel runs as the image's user with the seat's name and no GPU. Stopping the room
    removes the container and keeps the volume (the learner's work)."""
    from lab.course.exercises import EXERCISES
    from lab.course.room import plan as room_plan
    from lab.course.room.host import core_list

    base = docker_room["base"]
    seat_plan = room_plan.load(docker_room["state"] / "plan.json").seat(SEAT)
    admin, password = (docker_room["state"] / "instructor-password").read_text().split()
    seat = hub.admit(base, hub.log_in(base, admin, password), SEAT, "ds1-learner-passphrase")
    started = time.monotonic()
    seat.start(timeout=180)
    print(f"the seat's container served in {time.monotonic() - started:.1f} s")

    container = client.containers.get(f"jupyter-{SEAT}")
    assert container.image.tags == [JUPYTER_IMAGE]
    host = container.attrs["HostConfig"]
    assert host["CpusetCpus"] == core_list(seat_plan.cpus) and host["Memory"] == seat_plan.memory_bytes
    assert host["CpuQuota"] == int(seat_plan.cpu_share * host["CpuPeriod"])
    assert {u["Name"]: u["Hard"] for u in host["Ulimits"]} == {"memlock": MEMLOCK, "stack": 67108864}
    assert [(m["Name"], m["Destination"]) for m in container.attrs["Mounts"]] == [(f"lab-room-{SEAT}", "/lab/seat")]

    # the seat's copy of the lessons, each listed once (the image's JupyterLab settings hide the .py pair)
    listing = seat.server("GET", "/contents/notebooks").json()["content"]
    names = sorted(item["name"] for item in listing)
    assert names and all(n.endswith(".ipynb") for n in names) and "01_baseline_and_ddp.ipynb" in names, names
    news = requests.get(
        f"{base}/user/{SEAT}/lab/api/settings/@jupyterlab/apputils-extension:notification",
        headers=seat.headers,
        timeout=30,
    ).json()  # no "official Jupyter news" prompt
    assert news["schema"]["properties"]["fetchNews"]["default"] == "false", news
    probe = (
        "import json, os; print(json.dumps({'uid': os.getuid(), 'seat': os.environ.get('LAB_SEAT'), "
        "'gpus': os.environ.get('CUDA_VISIBLE_DEVICES'), 'runs': os.environ.get('LAB_LESSON_RUNS')}))"
    )
    out = json.loads(seat.execute(probe)["stdout"])
    assert out == {"uid": LAB_UID, "seat": SEAT, "gpus": "", "runs": "/lab/seat/runs/lessons"}, out
    # the answers are the image's root's alone (its build closed them), the starters beside them are not
    seek = (
        "import json, os; from lab.course.room import answers; kept = answers.files(); print(json.dumps({"
        "'kept': [p.name for p in kept], 'readable': [str(p) for p in kept if os.access(p, os.R_OK)], "
        "'starter': os.access(answers.EXERCISES / 'convert' / 'starter.py', os.R_OK), "
        "'docs': sorted(os.listdir('/lab/seat/docs'))}))"
    )
    out = json.loads(seat.execute(seek)["stdout"])
    assert out["kept"].count("solution.py") == len(EXERCISES) and "answers.md" in out["kept"], out
    assert out["readable"] == [] and out["starter"], out
    assert "glossary.md" in out["docs"] and "answers.md" not in out["docs"], out  # the seat's copy of docs/

    proc = docker_room["proc"]
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to the room's foreground group
    proc.wait(timeout=90)
    assert client.containers.list(all=True, filters={"name": f"jupyter-{SEAT}"}) == []
    assert client.volumes.get(f"lab-room-{SEAT}").name == f"lab-room-{SEAT}"
