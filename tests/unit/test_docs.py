"""The docs stay true: the README is a front page, every link lands, every command shown is run as typed.

A command in a shell code block of README.md or docs/*.md is run as typed by a test whose source holds it
verbatim, by this file (RUN_HERE, TORCHRUN_HERE), or is listed in NOT_RUN_HERE with the reason no test can.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, run

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(bash|sh|shell|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)

# Cheap (torch-free CLI, well under a second each): run here as typed, each with what it must print.
RUN_HERE = {
    ".venv/bin/lab --help": "pitfall",
    ".venv/bin/lab train --help-config": "global_batch_size:",
    ".venv/bin/lab pitfall": "set-epoch",
    ".venv/bin/lab choose --params 7B --gpus-per-node 8 --device h100": "choice:",
    ".venv/bin/lab choose --params 70B --gpus-per-node 8 --nodes 2 --device h100 --interconnect ib-ndr "
    "--json choice.json": "choice:",
    ".venv/bin/lab choose --params 1.5T --gpus-per-node 8 --nodes 64 --gpu-memory 141 --seq-len 4096 "
    "--hidden 8192 --layers 80": "choice:",
    ".venv/bin/lab memory --params 7e9 --world-size 8 --device h100": "ZeRO",
    ".venv/bin/lab memory --params 7e9 --seq-len 4096 --micro-batch 1 --hidden 4096 --heads 32 --layers 32": "ZeRO",
    ".venv/bin/lab memory --convention deepspeed --params 7e9 --world-size 8 --largest-layer 131e6 --device h100": (
        "27.71 GiB (29,750,000,000 bytes)"
    ),
    "diff -u examples/single_device.py examples/ddp_torchrun.py": "+    sampler = DistributedSampler(",
    ".venv/bin/lab room plan --gpus 8 --seats 4 --cores 112 --memory 2048": "| seat4 | 6,7 | 84-111 |",
    ".venv/bin/lab room plan --seats 4": "| seat4 |",
}

# Tens of seconds each (real torchrun jobs of 2 gloo ranks, 176 MB of synthetic data): run here in order in one
# folder (the report reads the benchmark's JSON).
TORCHRUN_HERE = [
    ".venv/bin/lab data synth --root data",
    ".venv/bin/lab pitfall set-epoch --json p.json",
    ".venv/bin/lab bench allreduce -b 8 -e 4M --nproc-per-node 2 --json allreduce.json",
    ".venv/bin/lab report allreduce.json",
]

GPUS = "needs a GPU server (8 GPUs, NCCL): CPU sizes of the same command run in tests/distributed"
DGX = (
    "needs a cluster of GPU hosts in playbooks/inventory/dgx.yml; tests/infra/test_ansible.py runs the play on "
    "local nodes"
)
REGISTRY = (
    "needs Docker with an image registry (the NGC base, Prometheus' images); tests/infra/test_container.py "
    "builds and runs the CPU variant from a local base"
)
HOURS = "trains full ResNet-18 for hours on 2 CPU cores; tests/distributed runs lab train at toy sizes"
MINUTES = "minutes of CPU per run; the test named in the docs beside it runs the same code at toy sizes"
PLACEHOLDER = (
    "holds a placeholder (<run_id>, <workshop id>) for a run of the reader's; tests/distributed runs it on real records"
)
SERVER = "a server that runs until stopped; tests/infra/test_jupyterlab_browser.py starts the same JupyterLab"
SUITE = "the test suite itself (or the workshop, whose parts tests/unit/test_workshop.py runs)"
NETWORK = "needs the internet (a download) or a GPU host's own Python; nothing here reaches either"

SLURM_JOB = (
    "acts on a job id of the reader's Slurm cluster; tests/infra/test_slurm.py submits, requeues and releases its "
    "own jobs on a real two-node Slurm"
)
SLURM_DGX = (
    "needs a Slurm cluster of GPU nodes; tests/infra/test_slurm.py submits the same script on a real two-node Slurm"
)

ROOM = (
    "acts on a running room's seats (root, system users); tests/infra/test_room.py serves a real room and runs it there"
)

TLS_ROOM = (
    "opens a room to the network as root; tests/infra/test_room.py serves the real room with --tls-self-signed "
    "(make room) and logs in over HTTPS, and tests/unit/test_room_tls.py refuses a certificate and key that differ"
)
NOT_RUN_HERE = {
    "sudo .venv/bin/lab room serve --bind 0.0.0.0 --tls-cert /etc/ssl/room.pem --tls-key /etc/ssl/room-key.pem": (
        TLS_ROOM
    ),
    "sudo .venv/bin/lab room serve --bind 0.0.0.0 --tls-self-signed": TLS_ROOM,
    "docker compose --profile room up hub": REGISTRY,
    ".venv/bin/lab room status": ROOM,
    ".venv/bin/lab room reset seat2": ROOM,
    "LAB_CONFIG=ddp sbatch -N 4 --gpus-per-node=8 slurm/lab.sbatch": SLURM_DGX,
    # the test cluster's GPU nodes (partition gpu) declare 2 GPUs and torch sees none behind them: test_slurm.py
    # submits these with -p gpu and --gpus-per-node=2, and asserts they fail rather than run on the CPU
    "sbatch -N 2 --gpus-per-node=8 slurm/lab.sbatch": SLURM_DGX,
    "sbatch -N 2 --gpus-per-node=8 slurm/validate.sbatch": SLURM_DGX,
    "LAB_METRICS_PORT_BASE=9500 LAB_TARGETS_DIR=/shared/prometheus/targets sbatch -N 2 slurm/lab.sbatch": SLURM_DGX,
    "squeue -u $USER": SLURM_JOB,
    "tail -f slurm-lab-ID.out": SLURM_JOB,
    "scancel ID": SLURM_JOB,
    "scontrol requeue ID": SLURM_JOB,
    "scontrol update JobId=ID StartTime=now": SLURM_JOB,
    "make lab": SUITE,
    "make test": SUITE,
    "make notebook": SERVER,
    "docker compose up jupyter": SERVER,
    "docker compose up lab": REGISTRY,
    "docker compose -f compose.yaml -f compose.cpu.yaml up lab": REGISTRY,
    "WITH_CIFAR=1 docker compose build lab": REGISTRY,
    "docker compose pull prometheus pushgateway grafana node-exporter dcgm-exporter": REGISTRY,
    "docker compose build jupyter": REGISTRY,
    "docker compose --profile room build hub": REGISTRY,
    "docker save lab:0.1.0 lab-jupyter:0.1.0 lab-hub:0.1.0 prom/prometheus:v2.53.4 prom/pushgateway:v1.11.0 "
    "grafana/grafana:11.4.0 prom/node-exporter:v1.8.2 nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04 "
    "| gzip > lab-images.tar.gz": REGISTRY,
    "docker load < lab-images.tar.gz": REGISTRY,
    "LAB_DATA_ROOT=/opt/lab/data docker compose up --no-build lab": REGISTRY,
    "cp playbooks/inventory/dgx.example.yml playbooks/inventory/dgx.yml": DGX,
    ".venv/bin/ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml": DGX,
    "ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml --tags validate": DGX,
    "ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml --skip-tags validate": DGX,
    "ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml -e lab_run_id=resnet-2x8 "
    '-e \'{"lab_train_overrides": ["train.epochs=5"]}\'': DGX,
    "ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml --skip-tags provision "
    '-e \'{"lab_target": ["-m", "lab", "bench", "allreduce", "-e", "1G", "--json", '
    '"{{ lab_node_run_dir }}/allreduce.json"]}\'': DGX,
    "ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml "
    "-e lab_metrics_port_base=9500 -e lab_prometheus_targets_dir=/srv/prometheus/targets": DGX,
    ".venv/bin/lab train --config ddp --nproc-per-node 8": GPUS,
    ".venv/bin/lab workshop --config workshop-gpu": GPUS,
    ".venv/bin/lab bench allreduce -b 8 -e 256M -f 2 --nproc-per-node 8": GPUS,
    ".venv/bin/lab bench allreduce --nproc-per-node 8 --min-busbw 376 --link nvlink4": GPUS,
    ".venv/bin/lab bench collective all_gather,alltoall --nproc-per-node 8 --min-busbw 250": GPUS,
    ".venv/bin/lab bench levers --nproc-per-node 8 --json levers.json --plot levers.png": GPUS,
    "make gpu-check": GPUS,
    # docs/acceptance.md: accepting a DGX cluster (lab accept's rule runs in tests/unit/test_acceptance.py on made
    # runs and in tests/infra/test_ansible.py on the local play's real passing and failing runs)
    "make setup": "creates .venv (torch, Ansible; minutes): make test runs the same target first, and the tests use it",
    "docker compose build lab": REGISTRY,
    "docker save lab:0.1.0 | gzip > /srv/images/lab-0.1.0.tar.gz": REGISTRY,
    "docker tag lab:0.1.0 registry.local:5000/lab:0.1.0": REGISTRY,
    "docker push registry.local:5000/lab:0.1.0": REGISTRY,
    "enroot import -o /shared/images/lab.sqsh dockerd://lab:0.1.0": "needs enroot and a Docker engine holding the lab "
    "image; enroot and pyxis cannot be installed here (tests/infra/test_slurm.py stands in for pyxis)",
    "LAB_IMAGE=/shared/images/lab.sqsh sbatch -N 4 --gpus-per-node=8 slurm/validate.sbatch": SLURM_DGX,
    ".venv/bin/ansible-playbook -i playbooks/inventory/dgx.yml playbooks/multinode.yml "
    "--tags provision,preflight,validate -e lab_run_id=accept-1 -e validate_dcgm_level=3 | tee accept-1.log": DGX,
    ".venv/bin/ansible -i playbooks/inventory/dgx.yml gpu_nodes -B 1800 -P 30 -m ansible.builtin.command -a "
    "'docker run --rm --gpus all --ipc host --ulimit memlock=-1 --ulimit stack=67108864 -v /raid/lab:/raid/lab "
    "-w /raid/lab {{ lab_image }} gpu-check --out /raid/lab/device-check'": DGX,
    ".venv/bin/ansible -i playbooks/inventory/dgx.yml gpu_nodes -m ansible.builtin.fetch -a "
    "'src=/raid/lab/device-check/gpu-check.json dest=runs/accept-1/device-check/{{ inventory_hostname }}.json "
    "flat=true'": DGX,
    ".venv/bin/lab accept runs/accept-1 --recap accept-1.log --platform h100-sxm-8": DGX,
    "LAB_DCGM_LEVEL=3 sbatch -N 4 --gpus-per-node=8 slurm/validate.sbatch": SLURM_DGX,
    "srun -N 4 --ntasks-per-node=1 --gpus-per-node=8 --exclusive bash -c "
    "'lab gpu-check --out runs/accept-1/device-check/$SLURMD_NODENAME'": SLURM_DGX,
    ".venv/bin/lab accept runs/validate-slurm-<job id>-<time>-<pid> --device-checks runs/accept-1/device-check "
    "--platform h100-sxm-8": SLURM_DGX,
    ".venv/bin/lab accept runs/multinode-<date>-<time>": "holds a placeholder for the local play's run folder; "
    "tests/infra/test_ansible.py runs lab accept's rule on the README play's real run folder",
    ".venv/bin/lab train --config baseline": HOURS,
    ".venv/bin/torchrun --standalone --nproc-per-node 2 -m lab train --config ddp": HOURS,
    ".venv/bin/lab train --config ddp --nproc-per-node 2": HOURS,
    ".venv/bin/lab train --config ddp --nproc-per-node 2 --profile": HOURS,
    ".venv/bin/lab train --config ddp --nproc-per-node 2 --set metrics.port_base=9500": HOURS,
    "curl -s http://127.0.0.1:9500/metrics | grep ^lab_train": "reads the run above while it trains; "
    "tests/infra/test_prometheus.py scrapes a real 2-rank run",
    ".venv/bin/lab train --config smoke --set train.lr=0.05 --set model.width=16": MINUTES,
    ".venv/bin/python examples/single_device.py --synthetic 2048 --epochs 2": MINUTES,
    ".venv/bin/torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --synthetic 2048 --epochs 2": MINUTES,
    ".venv/bin/lab bench strategies --nproc-per-node 2 --json strategies.json --plot strategies.png": MINUTES,
    ".venv/bin/lab bench collective all -b 1K -e 4M --nproc-per-node 2 --json c.json": MINUTES,
    ".venv/bin/lab bench scaling --mode weak --max-world-size 8 --json s.json --plot s.png": MINUTES,
    ".venv/bin/lab bench scaling --mode strong --global-batch 1024": MINUTES,
    ".venv/bin/lab memory --measure": MINUTES,
    ".venv/bin/lab bench pipeline --batch-size 256 --num-workers 2": MINUTES,
    ".venv/bin/lab bench metrics-overhead": MINUTES,
    ".venv/bin/lab bench hang-record --config smoke --nproc-per-node 2": MINUTES,
    ".venv/bin/lab predict --check-up-to 8 --json predict.json --plot predict.png": GPUS,
    "python -m lab launch --nproc-per-node 4 -- -m lab.course.pitfalls.planted_hang --plant other --rank 2 "
    "--timeout 20 --hang 4": "a planted hang of 20 s; tests/distributed/test_hang.py runs it (rank 2 of 4) with a "
    "shorter timeout",
    ".venv/bin/lab bench lightning --config workshop-cpu --steps 60": MINUTES,
    ".venv/bin/lab predict --rows my-rows.yaml": "a file of your own: tests/unit/test_predict.py writes the page's "
    "example rows and runs the command on them",
    ".venv/bin/lab predict --rows my-rows.yaml --calibration runs/accept-1/validate.json": "a file of your own and an "
    "acceptance run: tests/unit/test_predict.py and tests/infra/test_ansible.py run it on a real validate.json",
    ".venv/bin/lab report runs/<workshop id>": PLACEHOLDER,
    ".venv/bin/lab rerun runs/<run_id>": PLACEHOLDER,
    ".venv/bin/lab rerun runs/<run_id> --steps 40 --json rerun.json": PLACEHOLDER,
    ".venv/bin/lab rerun runs/<run_id> --set run.seed=1": PLACEHOLDER,
    ".venv/bin/lab data prepare --root data": NETWORK,
    "DS_BUILD_OPS=0 .venv/bin/pip wheel --no-build-isolation --no-deps deepspeed==0.19.8 -w wheels/": NETWORK,
    ".venv/bin/pip download -d wheels/ --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 "
    "pydantic hjson ninja msgpack einops py-cpuinfo psutil packaging tqdm": NETWORK,
}


def shell_commands(text: str) -> list[str]:
    """Each command line of the text's shell code blocks: continuations joined, comments dropped."""
    commands = []
    for kind, body in SHELL_BLOCK.findall(text):
        lines = (
            [line[2:] for line in body.splitlines() if line.startswith("$ ")]
            if kind == "console"
            else body.splitlines()
        )
        joined = re.sub(r"\\\n\s*", "", "\n".join(lines))
        for line in joined.splitlines():
            line = re.sub(r"\s+# .*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def documented_commands() -> dict[str, str]:
    return {command: doc.relative_to(ROOT).as_posix() for doc in DOCS for command in shell_commands(doc.read_text())}


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < 300, f"README.md has {lines} lines: move a topic to docs/"


def anchors(doc: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_lands_on_a_file_and_heading_that_exist():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check offline
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, broken


def test_every_documented_command_is_run_as_typed_or_says_why_not():
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != "test_docs.py")
    here = set(RUN_HERE) | set(TORCHRUN_HERE)
    documented = documented_commands()
    assert len(documented) > 20, "the command scan found almost nothing: it is broken"
    untested = [
        f"{doc}: {command}"
        for command, doc in documented.items()
        if command not in sources and command not in here and command not in NOT_RUN_HERE
    ]
    assert not untested, "run these in a test as typed, or list them in NOT_RUN_HERE with the reason:\n" + "\n".join(
        untested
    )
    stale = sorted((here | set(NOT_RUN_HERE)) - set(documented))
    assert not stale, f"no page shows these any more: {stale}"


@pytest.fixture
def checkout_like(tmp_path: Path) -> Path:
    """A folder where `.venv/bin/...` is this interpreter's venv, so a command runs as typed without writing
    into the checkout."""
    (tmp_path / ".venv").symlink_to(Path(PYTHON).parent.parent)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_a_cheap_documented_command_runs_as_typed(command, checkout_like):
    proc = run(shlex.split(command), cwd=checkout_like, check=False)
    assert proc.returncode == (1 if command.startswith("diff") else 0), proc.stderr[-2000:]  # diff: 1 = they differ
    assert RUN_HERE[command] in proc.stdout, proc.stdout[-2000:]


@pytest.mark.torchrun
def test_the_documented_torchrun_commands_run_as_typed(checkout_like):
    for command in TORCHRUN_HERE:
        run(shlex.split(command), cwd=checkout_like)
    assert (checkout_like / "data" / "cifar-10-batches-py" / "test_batch").exists()
    assert json.loads((checkout_like / "p.json").read_text())["demonstrated"] is True
    report = (checkout_like / "report.md").read_text()
    pictures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", report)
    assert pictures and all((checkout_like / picture).exists() for picture in pictures), report[:2000]
