"""The roles on real DGX hosts: provision leaves DGX OS's own Docker alone, preflight refuses busy or differing
nodes, launch passes InfiniBand, NCCL_NET=IB where asked and the shared checkpoint folder on, ansible.cfg is read.

What runs where:
- preflight: one real `ansible-playbook --tags preflight` on the two local "nodes", runtime docker, against
  stand-ins put first on PATH (nvidia-smi, nvidia-ctk, docker, ibstat, lsmod: none of them exists here, and the
  refusals need a GPU, a Docker engine and InfiniBand); it checks every refusal message and the "not present" line.
  The same checks skipped on a plain CPU node are run by tests/infra/test_ansible.py's preflight tests.
- provision and launch cannot run here (provision installs packages as root; launch with runtime docker needs an
  engine and GPUs): their decisions are the Jinja expressions of their tasks, rendered in-process with Ansible's own
  filters and tests for the situations of a DGX node; the order of their tasks is checked statically.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

import pytest
import yaml
from jinja2.nativetypes import NativeEnvironment

from tests.conftest import ROOT, run
from tests.infra.test_ansible import BIN, LOCAL, NODES, _playbook

ROLES = ROOT / "playbooks" / "roles"

# ------------------------------------------------------------------------------------------------- stand-ins

FAKES = {
    "nvidia-smi": """\
case "$*" in
  *--query-gpu=*) echo "NVIDIA H200, 570.86.15, 143771 MiB" ;;
  *--query-compute-apps=*) echo "4242, python3, 1024 MiB" ;;
  *) echo "| NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8 |" ;;
esac""",
    "nvidia-ctk": 'echo "NVIDIA Container Toolkit CLI version 1.17.8"',
    # image ids differ by image name; one leftover of the launch role, one container of compose's monitoring stack
    "docker": """\
case "$1 $2" in
  "info "*) echo '{"nvidia": {}, "runc": {}}' ;;
  "image inspect") for last; do :; done; printf 'sha256:%s\\n' "$(printf %s "$last" | sha256sum | cut -c1-64)" ;;
  "ps "*) printf '%s\\n' 'lab-job0-127.0.0.1 (Exited (137) 2 hours ago)|' 'lab-prometheus-1 (Up 3 days)|lab' ;;
  *) echo "stand-in docker: $*" >&2; exit 1 ;;
esac""",
    # mlx5_0 is down (refused), mlx5_1 up but trained down to HDR 200 (refused: an H200 node wants NDR 400),
    # mlx5_3 up at 400, mlx5_2 an Ethernet port that is down (not NCCL's IB: not refused)
    "ibstat": r"""printf "CA 'mlx5_0'\n\tCA type: MT4129\n\tPort 1:\n"
printf "\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 10\n\t\tLink layer: InfiniBand\n"
printf "CA 'mlx5_1'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 200\n"
printf "\t\tLink layer: InfiniBand\n"
printf "CA 'mlx5_2'\n\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Disabled\n\t\tRate: 10\n"
printf "\t\tLink layer: Ethernet\n"
printf "CA 'mlx5_3'\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n"
printf "\t\tLink layer: InfiniBand\n"
""",
    "lsmod": r"printf 'Module  Size  Used by\nnvidia_uvm  1  0\nnvidia  2  1 nvidia_uvm\n'",
}


def _image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()[:12]


def test_preflight_refuses_busy_gpus_leftovers_another_image_and_broken_infiniband_one_line_each(tmp_path, monkeypatch):
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name, body in FAKES.items():
        (fakes / name).write_text(f"#!/bin/sh\n{body}\n")
        (fakes / name).chmod(stat.S_IRWXU)
    # ansible_connection=local: the nodes' commands inherit ansible-playbook's PATH, stand-ins first
    monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "infiniband").mkdir()  # 127.0.0.1 "has" /dev/infiniband, 127.0.0.2 has none
    inventory = yaml.safe_load(LOCAL.read_text())
    hosts = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    # no driver banner: no DMA-BUF, so GPUDirect RDMA needs nvidia_peermem (whatever this machine's driver is)
    hosts["127.0.0.1"].update(
        preflight_ib_device_dir=str(tmp_path / "infiniband"),
        preflight_nvidia_version_file=str(tmp_path / "no-driver-banner"),
    )
    hosts["127.0.0.2"].update(
        preflight_ib_device_dir=str(tmp_path / "no-infiniband"), lab_image="lab:other", lab_nccl_net_ib=True
    )
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))

    proc, recap = _playbook(
        tmp_path, tmp_path / "inventory.yml", "--tags", "preflight", check=False, lab_runtime="docker"
    )
    assert proc.returncode == 2 and all(recap[n]["failed"] == 1 for n in NODES), proc.stdout[-3000:]
    errors = [
        line.split("Action failed: ", 1)[1]
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.startswith("[ERROR]: Task failed")
    ]
    ids = f"{_image_id('lab:0.1.0')} on 127.0.0.1, {_image_id('lab:other')} on 127.0.0.2"
    peermem = not Path("/sys/module/nvidia_peermem").exists()  # a GPU CI machine may really have it loaded
    expected = {
        "127.0.0.1": [
            "the GPUs are busy: 4242, python3, 1024 MiB (pid, process, memory from nvidia-smi --query-compute-apps); "
            "stop those processes",
            "lab containers are still on this node: lab-job0-127.0.0.1 (Exited (137) 2 hours ago); remove them",
            f"the lab image lab:0.1.0 differs across the nodes: {ids}; put the same image on every node",
            "InfiniBand ports not Active: mlx5_0 port 1 is Down; check the cables and the subnet manager",
            "InfiniBand ports below 400 Gb/s: mlx5_1 port 1 at 200 Gb/s; reseat or replace the cable",
            *(
                [
                    f"{tmp_path / 'infiniband'} exists but GPUDirect RDMA has no kernel support here: the "
                    "nvidia_peermem module is not loaded and DMA-BUF is not available"
                ]
                if peermem
                else []
            ),
        ],
        "127.0.0.2": [
            "the GPUs are busy: 4242, python3, 1024 MiB",
            "lab containers are still on this node: lab-job0-127.0.0.1 (Exited (137) 2 hours ago); remove them",
            f"the lab image lab:other differs across the nodes: {ids};",
            f"lab_nccl_net_ib is true (NCCL_NET=IB) but {tmp_path / 'no-infiniband'} does not exist here",
        ],
    }
    for node, messages in expected.items():
        mine = [e for e in errors if e.startswith(f"{node}: ")]
        assert len(mine) == len(messages), (node, mine)
        for message in messages:
            assert sum(e.startswith(f"{node}: {message}") for e in mine) == 1, (node, message, mine)
    assert not any("lab-prometheus-1" in e or "mlx5_2" in e for e in errors), errors  # compose's stack; Ethernet
    # InfiniBand present: NCCL picks its network (NCCL_NET=IB would leave SHARP's plugin unused) unless asked;
    # absent: the checks say so and are skipped
    assert "127.0.0.1: InfiniBand present: NCCL picks its network itself (a net plugin such as the SHARP" in proc.stdout
    assert "127.0.0.1: NCCL_NET=IB" not in proc.stdout
    assert (
        f"127.0.0.2: not present here, so not checked: {tmp_path / 'no-infiniband'} (ibstat ports Active and "
        "their rate, nvidia_peermem or DMA-BUF, NCCL_NET=IB)"
    ) in proc.stdout
    # refused before lab doctor and before anything was written
    assert "Run lab doctor" not in proc.stdout
    assert not (tmp_path / "controller").exists() and not (tmp_path / "nodes").exists()


# ------------------------------------------------------------------------------------------------- rendering


def _jinja() -> NativeEnvironment:
    """Ansible's own filters and tests on a native-types Jinja environment, as Ansible renders set_fact values."""
    from ansible.plugins.filter.core import FilterModule
    from ansible.plugins.filter.mathstuff import FilterModule as MathFilters
    from ansible.plugins.test.core import TestModule

    env = NativeEnvironment()
    env.filters.update(FilterModule().filters())
    env.filters.update(MathFilters().filters())
    env.tests.update(TestModule().tests())
    return env


def _tasks(role: str, file: str = "main.yml") -> list[dict]:
    """The role's tasks in order, a block's tasks inlined with the block's `when` added to theirs."""
    out: list[dict] = []

    def walk(tasks: list[dict], when: list[str]) -> None:
        for task in tasks:
            conditions = when + ([task["when"]] if isinstance(task.get("when"), str) else task.get("when", []))
            if "block" in task:
                walk(task["block"], conditions)
            else:
                out.append({**task, "_when": conditions})

    walk(yaml.safe_load((ROLES / role / "tasks" / file).read_text()), [])
    return out


def _task(tasks: list[dict], name: str) -> dict:
    return next(t for t in tasks if t["name"] == name)


def _render(env: NativeEnvironment, template: str, variables: dict):
    return env.from_string(template.strip()).render(**variables)


def _condition(env: NativeEnvironment, task: dict, variables: dict) -> bool:
    return all(_render(env, "{{ " + c + " }}", variables) for c in task["_when"])


PROVISION_FACTS = ("Note what already works and what is missing", "Note the steps this node needs")
NODES_SEEN = {  # situation: (docker info's rc and stdout, nvidia-smi's rc, other apt sources listing docker, toolkit)
    "DGX OS: Docker and its nvidia runtime work": ((0, '{"nvidia": {}, "runc": {}}'), 0, True, True),
    "a fresh Ubuntu GPU host": ((2, ""), 0, False, False),
    "Docker from the OS's own sources, daemon stopped": ((1, ""), 0, True, False),
    "Docker works, the toolkit's repository is there, no nvidia runtime yet": ((0, '{"runc": {}}'), 0, False, True),
    "a CPU host with a working Docker": ((0, '{"runc": {}}'), 2, False, False),
}


@pytest.mark.parametrize("situation", NODES_SEEN)
def test_provision_adds_a_repository_only_where_nothing_provides_docker_or_the_toolkit(situation):
    (rc, stdout), smi, docker_listed, toolkit_listed = NODES_SEEN[situation]
    env, tasks = _jinja(), _tasks("provision")
    facts = {
        "provision_docker_info": {"rc": rc, "stdout": stdout},
        "provision_nvidia_smi": {"rc": smi},
        "provision_nvidia_toolkit_force": False,
    }
    for name in PROVISION_FACTS:
        for key, value in _task(tasks, name)["ansible.builtin.set_fact"].items():
            facts[key] = _render(env, value, facts)
    # grep over /etc/apt: rc 0 when another source lists the URI, 1 when none does; skipped when not needed
    facts["provision_apt_sources"] = {
        "results": [
            {"rc": 0 if listed else 1} if needed else {"skipped": True}
            for listed, needed in (
                (docker_listed, facts["provision_install_docker"]),
                (toolkit_listed, facts["provision_install_toolkit"]),
            )
        ]
    }
    for key, value in _task(tasks, "Choose the repositories to add")["ansible.builtin.set_fact"].items():
        facts[key] = _render(env, value, facts)
    deciding = (
        "Say that Docker and its NVIDIA runtime are left as they are",
        "Add Docker's apt repository",
        "Install Docker Engine",
        "Add NVIDIA's container toolkit repository",
        "Register the nvidia runtime with Docker",
        "Install python3-debian for the repository tasks",
    )
    runs = {name: _condition(env, _task(tasks, name), facts) for name in deciding}

    works = rc == 0 and ("nvidia" in stdout or smi != 0)
    assert runs["Say that Docker and its NVIDIA runtime are left as they are"] == works
    assert runs["Add Docker's apt repository"] == (rc != 0 and not docker_listed)
    assert runs["Install Docker Engine"] == (rc != 0)
    assert runs["Add NVIDIA's container toolkit repository"] == (
        smi == 0 and "nvidia" not in stdout and not toolkit_listed
    )
    assert runs["Register the nvidia runtime with Docker"] == (smi == 0 and "nvidia" not in stdout)
    repo_added = runs["Add Docker's apt repository"] or runs["Add NVIDIA's container toolkit repository"]
    assert runs["Install python3-debian for the repository tasks"] == repo_added


def test_provision_installs_python3_debian_before_any_deb822_repository_and_reads_runtimes_as_json():
    # Static (the role installs packages as root; there is no DGX here): the order of the tasks, and the
    # runtimes read with docker's Go template and parsed as JSON, not grepped from `docker info`'s text.
    tasks = _tasks("provision")
    names = [t["name"] for t in tasks]
    debian = names.index("Install python3-debian for the repository tasks")
    assert _task(tasks, names[debian])["ansible.builtin.apt"]["name"] == "python3-debian"
    deb822 = [i for i, t in enumerate(tasks) if "ansible.builtin.deb822_repository" in t]
    assert len(deb822) == 2 and all(i > debian for i in deb822)
    reads = [t for t in tasks if t.get("ansible.builtin.command", {}).get("argv", [])[:2] == ["docker", "info"]]
    env = _jinja()
    assert reads and all(
        _render(env, t["ansible.builtin.command"]["argv"][3], {}) == "{{json .Runtimes}}" for t in reads
    )
    text = (ROLES / "provision" / "tasks" / "main.yml").read_text()
    assert "from_json" in text and "--format, json" not in text and "grep -i nvidia" not in text


def test_launch_passes_infiniband_the_job_env_and_the_shared_checkpoint_folder():
    env, tasks = _jinja(), _tasks("launch")
    facts = {
        "lab_runtime": "docker",
        "launch_container": "lab-job1-dgx-01",
        "preflight_gpu_count": 8,
        "launch_docker_gpus": "all",
        "lab_workdir": "/raid/lab",
        "lab_checkpoint_dir": "/lustre/ckpt",
        "preflight_ib_device": "/dev/infiniband",
        "launch_docker_extra_args": ["--cap-add=IPC_LOCK"],
        "lab_image": "lab:0.1.0",
        "lab_env": {"NCCL_DEBUG": "WARN"},
        "lab_nproc_per_node": 8,
        "preflight_job_env": {"NCCL_DEBUG": "WARN", "NCCL_NET": "IB"},
        "lab_train_config": "ddp",
        "lab_run_id": "job1",
        "lab_metrics_port_base": 0,
        "lab_train_overrides": ["train.epochs=2"],
        "lab_target": [],
        "lab_venv": "/opt/lab/.venv",
    }
    for name in ("Choose the worker count on this node", "Build the lab launch command line"):
        for key, value in _task(tasks, name)["ansible.builtin.set_fact"].items():
            facts[key] = _render(env, value, facts)
    runner = facts["launch_runner"]
    assert facts["launch_env"] == {"NCCL_DEBUG": "WARN", "NCCL_NET": "IB"}
    assert runner.count("--device=/dev/infiniband") == 1 and "--env=NCCL_NET" in runner
    assert runner[runner.index("/lustre/ckpt:/lustre/ckpt") - 1] == "--volume"
    target = facts["launch_target"]
    assert target.index("--set=checkpoint.dir=/lustre/ckpt") < target.index("--set=train.epochs=2")
    assert _task(tasks, "Start every node at once")["environment"] == "{{ launch_env }}"
    # an inventory that still names the device itself gets it once; no IB, no shared folder: neither appears
    facts.update(launch_docker_extra_args=["--device=/dev/infiniband"])
    runner = _render(
        env, _task(tasks, "Build the lab launch command line")["ansible.builtin.set_fact"]["launch_runner"], facts
    )
    assert runner.count("--device=/dev/infiniband") == 1
    facts.update(preflight_ib_device="", lab_checkpoint_dir="", launch_docker_extra_args=[])
    built = _task(tasks, "Build the lab launch command line")["ansible.builtin.set_fact"]
    assert not any("infiniband" in a or "ckpt" in a for a in _render(env, built["launch_runner"], facts))
    assert not any("checkpoint.dir" in a for a in _render(env, built["launch_target"], facts))


PCIE_TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tPIX\tSYS\tSYS\t0-31\t0\t\tN/A
GPU1\tPIX\t X \tSYS\tSYS\t0-31\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tNV4\t32-63\t1\t\tN/A
GPU3\tSYS\tSYS\tNV4\t X \t32-63\t1\t\tN/A
"""  # four PCIe GPUs, two of them joined by an NVLink bridge (nvidia-smi topo -m's layout)


@pytest.mark.parametrize(
    ("node", "mode", "pairs"),
    [
        ("h100", "auto", []),  # NVSwitch: NV18 between every pair, the all-GPU check covers them
        ("h100", "always", 28),
        ("pcie", "auto", 6),
        ("pcie", "never", []),
        ("cpu", "always", []),
    ],
)
def test_validate_runs_gpu_pairs_only_where_nvlink_does_not_join_every_pair(node, mode, pairs):
    import base64

    env = _jinja()
    fixture = ROOT / "tests" / "fixtures" / "fabric" / "h100"  # reproduced nvidia-smi outputs of an 8 x H100 node
    texts = {
        "h100": ("0", (fixture / "nvidia-smi-gpus.txt").read_text(), (fixture / "nvidia-smi-topo.txt").read_text()),
        "pcie": ("0", "".join(f"{i}, NVIDIA L40S, GPU-{i}, 46068, 4, 4, 16, 16\n" for i in range(4)), PCIE_TOPO),
        "cpu": ("127", "nvidia-smi: not installed\n", "nvidia-smi: not installed\n"),
    }[node]
    tasks = _tasks("validate")
    choose = _task(tasks, "Choose the checks of this node")
    facts = {
        "validate_facts_read": {"results": [{"content": base64.b64encode(t.encode()).decode()} for t in texts]},
        "validate_pairs": mode,
        "lab_env": {},
        "lab_workdir": "/raid/lab",
        "validate_gpu_bench": ["-b", "1G"],
        "validate_cpu_bench": ["-b", "64K"],
    }
    for key, value in choose["vars"].items():
        facts[key] = _render(env, value, facts)
    for key in ("validate_gpus", "validate_all_nvlink"):
        facts[key] = _render(env, choose["ansible.builtin.set_fact"][key], facts)
    chosen = _render(
        env,
        _task(tasks, "Choose the GPU pairs to check alone (validate_pairs {{ validate_pairs }})")[
            "ansible.builtin.set_fact"
        ]["validate_gpu_pairs"],
        facts,
    )
    assert len(facts["validate_gpus"]) == {"h100": 8, "pcie": 4, "cpu": 0}[node]
    assert facts["validate_all_nvlink"] is (node == "h100")
    assert (len(chosen) if pairs else chosen) == pairs and (not chosen or chosen[0] == "0,1")


def test_validate_and_launch_containers_are_named_and_removed_in_always_however_the_check_ends():
    # An async timeout kills the docker client, not its container, which would keep the GPUs: each container is
    # named and `docker rm --force NAME` runs in the block's always:. Rendered here (no Docker engine or GPU).
    env = _jinja()
    (block,) = yaml.safe_load((ROLES / "validate" / "tasks" / "run.yml").read_text())
    facts = {
        "lab_runtime": "docker",
        "lab_run_id": "job1",
        "validate_check": "node-dgx-01",
        "lab_image": "lab:0.1.0",
        "validate_env": {"NCCL_NET": "IB"},
        "validate_check_env": {"NCCL_DEBUG": "INFO"},
        "validate_docker_head": ["docker", "run", "--rm"],
        "validate_docker_gpus": "all",
        "validate_lab_args": ["bench", "allreduce", "--json", "/raid/lab/runs/job1/validate/node-dgx-01.json"],
    }
    for key in ("validate_container", "validate_check_env_all", "validate_argv"):
        facts[key] = _render(env, block["vars"][key], facts)
    argv = facts["validate_argv"]
    assert argv[argv.index("--name") + 1] == "lab-validate-job1-node-dgx-01"
    assert {"--env=NCCL_NET", "--env=NCCL_DEBUG"} <= set(argv) and argv[argv.index("lab:0.1.0") + 1 :][:2] == [
        "bench",
        "allreduce",
    ]
    (remove,) = block["always"]
    assert remove["ansible.builtin.command"]["argv"] == ["docker", "rm", "--force", "{{ validate_container }}"]
    assert remove["when"] == "lab_runtime == 'docker'" and [t["async"] for t in block["block"] if "async" in t]

    launch = next(
        t
        for t in yaml.safe_load((ROLES / "launch" / "tasks" / "main.yml").read_text())
        if t["name"] == "Run the job on every node at once"
    )
    (remove,) = launch["always"]
    assert remove["ansible.builtin.command"]["argv"] == ["docker", "rm", "--force", "{{ launch_container }}"]
    assert (
        "--name"
        in _task(_tasks("launch"), "Build the lab launch command line")["ansible.builtin.set_fact"]["launch_runner"]
    )


def test_collect_records_each_nodes_image_id_in_nodes_json():
    env = _jinja()
    write = _task(_tasks("collect"), "Write every node's outcome to nodes.json")
    # runtime docker: the id preflight read; runtime process: None (null); a node preflight did not see: ""
    hostvars = {"dgx-01": {"preflight_image_id": "sha256:1"}, "dgx-02": {"preflight_image_id": None}, "dgx-03": {}}
    image_ids = _render(
        env,
        write["vars"]["collect_nodes"]["image_id"],
        {"ansible_play_hosts_all": list(hostvars), "hostvars": hostvars},
    )
    assert image_ids == {"dgx-01": "sha256:1", "dgx-02": None, "dgx-03": ""}


DRIVER_BANNERS = {  # /proc/driver/nvidia/version's first line, as the two kinds of kernel modules print it
    "open": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (dvs-builder@U16)",
    "proprietary": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 23 22:47:27 UTC 2025",
}


@pytest.mark.parametrize(
    ("kernel", "modules", "dmabuf"),
    [
        ("6.8.0-45-generic", "open", True),
        ("5.15.0-1063-nvidia", "open", True),
        ("5.4.0-200-generic", "open", False),
        ("6.8.0-45-generic", "proprietary", False),
        ("6.8.0-45-generic", None, False),
    ],
)
def test_preflight_accepts_dma_buf_instead_of_nvidia_peermem_on_a_new_kernel_with_the_open_modules(
    kernel, modules, dmabuf
):
    # The decision is preflight's Jinja (no DGX here); the refusal it feeds runs for real in the stand-in test above.
    env = _jinja()
    notes = _task(
        _tasks("preflight"), "Read the ports of the HCAs to check (those NCCL_IB_HCA names, else every InfiniBand port)"
    )
    facts = {
        "preflight_kernel": {"stdout": kernel},
        "preflight_driver_banner": {"stdout": DRIVER_BANNERS[modules]} if modules else {"rc": 1, "stdout": ""},
    }
    assert _render(env, notes["ansible.builtin.set_fact"]["preflight_dmabuf"], facts) is dmabuf


def test_the_job_variables_are_defaulted_and_documented():
    play = yaml.safe_load((ROOT / "playbooks" / "multinode.yml").read_text())[0]
    defaults = next(t for t in play["tasks"] if t["name"] == "Set the defaults of the job's variables")
    assert defaults["ansible.builtin.set_fact"]["lab_checkpoint_dir"] == "{{ lab_checkpoint_dir | default('') }}"
    example = (ROOT / "playbooks" / "inventory" / "dgx.example.yml").read_text()
    for variable in ("lab_checkpoint_dir", "lab_nccl_net_ib"):
        assert re.search(rf"^ +# {variable}: \S", example, re.M), variable


def test_ansible_cfg_at_the_root_is_read_and_keeps_one_line_results():
    # ansible-playbook reads ./ansible.cfg of the directory it runs in: the tests (and the README) run from ROOT.
    dump = run([str(BIN / "ansible-config"), "dump", "--only-changed", "-t", "all"]).stdout
    assert f"CONFIG_FILE() = {ROOT / 'ansible.cfg'}" in dump
    assert re.search(r"^DEFAULT_FORKS\(.*\) = 64$", dump, re.M)
    assert re.search(r"^pipelining\(.*\) = True$", dump, re.M)
    # json results on one line: the "[ERROR]: Task failed" and "fatal:" lines test_ansible.py parses
    assert re.search(r"^result_format\(.*\) = json$", dump, re.M) and "yaml" not in dump
    assert not (ROOT / "playbooks" / "ansible.cfg").exists()
