"""The real `ansible-playbook` runs playbooks/multinode.yml on two local "nodes" (127.0.0.1, 127.0.0.2).

Every run writes into the test's tmp dir: the nodes' work dirs and the controller's runs/
come in as extra vars. The nodes use ansible_connection=local and the lab in this venv.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.machine.health import acceptance
from tests.conftest import PYTHON, ROOT, run

BIN = Path(PYTHON).parent
PLAYBOOK = ROOT / "playbooks" / "multinode.yml"
LOCAL = ROOT / "playbooks" / "inventory" / "local.yml"
NODES = ["127.0.0.1", "127.0.0.2"]
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TINY_TRAINING = ["model.width=8", "train.max_steps=4"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _playbook(tmp: Path, inventory: Path = LOCAL, *args: str, check: bool = True, **extra: Any) -> Any:
    """ansible-playbook with the job's variables pointed into `tmp`; returns (process, recap by host)."""
    variables = {
        "lab_controller_runs": str(tmp / "controller"),
        "lab_workdir": str(tmp / "nodes") + "/{{ inventory_hostname }}",
        "lab_rdzv_port": _free_port(),
        "lab_run_id": "job1",
        "lab_train_overrides": TINY_TRAINING,
        **extra,
    }
    (tmp / "vars.json").write_text(json.dumps(variables))
    # The validate play has tests of its own (and runs in the README's command, tested as typed): the
    # other plays' tests skip it, which saves each about 20 s.
    only = (
        [] if any(a.startswith("--tags") or a.startswith("--skip-tags") for a in args) else ["--skip-tags", "validate"]
    )
    proc = run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            str(PLAYBOOK),
            "-e",
            f"@{tmp / 'vars.json'}",
            *only,
            *args,
        ],
        env=ANSIBLE_ENV,
        check=check,
        timeout=400,
    )
    return proc, _recap(proc)


ANSIBLE_ENV = {"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "OMP_NUM_THREADS": "1"}


def _recap(proc) -> dict[str, dict[str, int]]:
    return {
        host: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, counts)))
        for host, *counts in RECAP.findall(proc.stdout)
    }


def test_playbooks_pass_ansible_lint_yamllint_and_syntax_check():
    lint = run([str(BIN / "ansible-lint"), "--offline", "--profile", "production", "playbooks/"], check=False)
    assert lint.returncode == 0, lint.stdout[-4000:] + lint.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in lint.stdout + lint.stderr
    assert not (ROOT / ".ansible-lint").read_text().count("skip_list")  # no rule skipped for the whole project
    run([str(BIN / "yamllint"), "--strict", "playbooks/", ".yamllint", ".ansible-lint"])
    for inventory in ("local.yml", "dgx.example.yml"):
        run([str(BIN / "ansible-playbook"), "--syntax-check", "-i", f"playbooks/inventory/{inventory}", str(PLAYBOOK)])


README_COMMAND = ".venv/bin/ansible-playbook -i playbooks/inventory/local.yml playbooks/multinode.yml"


@pytest.fixture
def readme_run():
    """The README's two-node command as a new user types it: from the checkout, no extra variables, so the
    results land in the checkout's runs/ (removed afterwards with the nodes' folders under /tmp/lab-local)."""
    import shutil

    assert README_COMMAND in (ROOT / "README.md").read_text()
    made: list[Path] = []
    yield made
    for job in made:
        shutil.rmtree(job, ignore_errors=True)
        for node in NODES:
            shutil.rmtree(Path("/tmp/lab-local") / node / "runs" / job.name, ignore_errors=True)


def test_the_readme_two_node_command_as_typed_validates_trains_and_brings_the_results_home(readme_run, tmp_path):
    started = time.monotonic()
    runs = ROOT / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    proc = run(shlex.split(README_COMMAND), cwd=ROOT, env=ANSIBLE_ENV, check=False, timeout=400)
    seconds = time.monotonic() - started
    new = sorted(set(runs.iterdir()) - before)
    readme_run.extend(new)
    recap = _recap(proc)
    assert proc.returncode == 0 and set(recap) == set(NODES), proc.stdout[-4000:]
    assert all(r["failed"] == r["unreachable"] == 0 for r in recap.values()), proc.stdout[-4000:]
    assert len(new) == 1 and new[0].name.startswith("multinode-"), new
    job = new[0]

    # the fabric was validated first, on each node and across both, and the figures came home
    validate = json.loads((job / "validate.json").read_text())
    assert validate["ok"] and validate["problems"] == [] and validate["platform"] == "ansible"
    assert validate["all_nodes"]["world_size"] == 2 and validate["all_nodes"]["wrong"] == 0
    for node in NODES:
        (pair,) = validate["nodes"][node]["pairs"]
        assert pair["pair"] == "cpu" and pair["ok"] and pair["avg_busbw"] > 0
        assert validate["nodes"][node]["platform"]["key"] == "cpu"  # no nvidia-smi here: no GPU checks apply
        assert validate["nodes"][node]["health"]["dcgm_diag"] == "not applicable"
        # node-facts.sh ran on the node and its facts came home beside the all-reduce results lab validate judged
        assert (job / "validate" / f"facts-{node}" / "nvidia-smi-gpus.rc").read_text().strip() == "127"
        assert (job / "validate" / f"node-{node}.json").exists()
    _accepted_as_a_cpu_cluster_and_refused_once_broken(job, proc.stdout, tmp_path)
    _predicted_from_its_own_links(job)

    # A run that succeeded leaves launch logs without pages of C++ stack: the roll call no longer polls the
    # head's store once every node arrived, and lab launch folds the stack c10d prints under a warning when
    # an agent closes the rendezvous after the agent hosting its store has gone (it says so in one line).
    for node in NODES:
        log = (job / "nodes" / node / "launch.log").read_text()
        assert "frame #" not in log and "Exception raised from" not in log, log[-3000:]
        assert "[c10d]" not in log or "are torchrun's agents closing the rendezvous" in log, log[-3000:]
    # world size 2 reached: both node ranks trained in one world (rank 0 gathered every rank into the manifest)
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert sorted(r["node_rank"] for r in manifest["ranks"]) == [0, 1]
    # training finished
    summary = json.loads((job / "summary.json").read_text())
    assert summary["status"] == "completed"
    steps = [
        json.loads(line)["step"]
        for line in (job / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert steps and steps[-1] == 16  # the smoke config's 16 steps

    # both nodes' run directories came back, each with its launch log and lab doctor report
    for node in NODES:
        folder = job / "nodes" / node
        assert (folder / "launch.log").stat().st_size > 0
        doctor = json.loads((folder / "doctor.json").read_text())
        assert doctor["ok"] and {"torch", "gloo", "shm", "output"} <= {c["name"] for c in doctor["checks"]}
    holders = [n for n in NODES if (job / "nodes" / n / "manifest.json").exists()]
    assert len(holders) == 1  # global rank 0 alone writes records; the merge copied its node's up
    assert (job / "nodes" / holders[0] / "manifest.json").read_bytes() == (job / "manifest.json").read_bytes()
    nodes = json.loads((job / "nodes.json").read_text())
    assert nodes["records_from"] == holders[0] and nodes["nnodes"] == "2"
    assert {n: o["rc"] for n, o in nodes["launch"].items()} == {n: 0 for n in NODES}

    # the merged report, made on the controller by `lab report`
    report = (job / "report.md").read_text()
    assert job.name in report and "## Fabric validation" in report and "Verdict: held" in report
    for png in re.findall(r"\]\(([^)]+\.png)\)", report):
        assert (job / png).stat().st_size > 0

    # the torchrun line on every node is the one lab.run.cluster.launch builds (`lab launch`), not a copy in Jinja
    head = nodes["launch"]["127.0.0.1"]["command"]
    assert shlex.split(head)[:2] == [str(BIN / "lab"), "launch"]
    dry = run([*shlex.split(head)[:2], "--dry-run", *shlex.split(head)[2:]]).stdout.strip()
    log = (job / "nodes" / "127.0.0.1" / "launch.log").read_text().splitlines()
    # ... and the workers run the config lab launch checked, handed down in a file of its own (the dry run shows
    # the target as given: nothing is written by it)
    torchrun, _, given = dry.partition(" -m lab train ")
    ran = next(line for line in log if line.startswith("$ "))
    assert given.startswith("--config smoke") and ran.startswith(f"$ {torchrun} -m lab train --resolved /")
    assert ran.endswith("/config.json") and f"lab launch: -m lab train {given}: checked here" in "\n".join(log)
    print(f"two-node play: {seconds:.0f} s")


def _predicted_from_its_own_links(job: Path) -> None:
    """docs/prediction.md: `lab predict --calibration` takes the links this play's validate run measured (the two
    CPU "nodes'" all-reduces) instead of the rows' own, and says which inputs came from it."""
    table = ROOT / "lab" / "measure" / "prediction" / "tables" / "pytorch-ddp-25mb.yaml"
    proc = run([PYTHON, "-m", "lab", "predict", "--rows", str(table), "--calibration", str(job / "validate.json")])
    validate = json.loads((job / "validate.json").read_text())
    node = min(n["pairs"][0]["busbw"] or n["pairs"][0]["avg_busbw"] for n in validate["nodes"].values())
    assert f"links from {job / 'validate.json'}: a node {node:g} GB/s" in proc.stdout, proc.stdout[-2000:]
    assert "1 rank(s) a node (measured: every row's own links replaced)" in proc.stdout


def _accepted_as_a_cpu_cluster_and_refused_once_broken(job: Path, output: str, tmp_path: Path) -> None:
    """docs/acceptance.md's pass rule (lab accept) on the play's real run: it passes, saying why no device check
    applies (CPU nodes), and fails as soon as validate.json says not ok, a node's recap failed, or the nodes are
    asked to be DGX H100s."""
    verdict = acceptance.judge(job, recap_text=output)
    assert verdict["verdict"] == "held" and verdict["reasons"] == [], verdict
    assert verdict["notes"] == [f"{node} has no GPU (platform cpu): no device check to run" for node in NODES]
    assert acceptance.judge(job, platform="h100-sxm-8")["reasons"][0].startswith("127.0.0.1: platform cpu, not")
    broken = tmp_path / "broken"
    shutil.copytree(job, broken, ignore=shutil.ignore_patterns("nodes", "checkpoints"))
    validate = json.loads((broken / "validate.json").read_text())
    (broken / "validate.json").write_text(json.dumps({**validate, "ok": False}))
    failed = re.sub(r"^(127\.0\.0\.2\s+: .*)failed=0", r"\1failed=1", output, flags=re.M)
    verdict = acceptance.judge(broken, recap_text=failed)
    assert verdict["reasons"] == ["validate.json: ok is false", "127.0.0.2: PLAY RECAP failed=1 unreachable=0"]


def test_validate_alone_fails_naming_the_node_below_its_floor_and_the_slow_node_of_the_ring(tmp_path):
    """Three local nodes, `--tags validate`. 127.0.0.2 demands an impossible busbw of its own CPU pair; 127.0.0.3
    demands one of any check across nodes it takes part in. So: 127.0.0.2 fails naming its pair; all nodes
    together miss (127.0.0.3's floor is the highest), the ring's pairs are measured, 1+2 passes, 2+3 and
    3+1 miss, and 127.0.0.3, in both slow pairs, is named the slow node. Every figure is in validate.json."""
    inventory = yaml.safe_load(LOCAL.read_text())
    hosts = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    tiny = inventory["all"]["children"]["gpu_nodes"]["vars"]["lab_validate_min_busbw_gbps"]
    hosts["127.0.0.2"]["lab_validate_min_busbw_gbps"] = {**tiny, "pair": 1e9}
    hosts["127.0.0.3"] = {"lab_node_address": "127.0.0.3", "lab_validate_min_busbw_gbps": {**tiny, "nodes": 1e9}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    proc, recap = _playbook(tmp_path, tmp_path / "inventory.yml", "--tags", "validate", check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert {host: r["failed"] for host, r in recap.items()} == {"127.0.0.1": 0, "127.0.0.2": 1, "127.0.0.3": 1}
    fatal = {line.split("]")[0].split("[")[1]: line for line in proc.stdout.splitlines() if line.startswith("fatal:")}
    assert "127.0.0.2: all-reduce of two CPU processes: busbw" in fatal["127.0.0.2"]
    assert "below its floor 1e+09 GB/s" in fatal["127.0.0.2"]
    assert "all nodes: 3 ranks: busbw" in fatal["127.0.0.3"] and "slow node: 127.0.0.3 " in fatal["127.0.0.3"]

    validate = json.loads((tmp_path / "controller" / "job1" / "validate.json").read_text())
    assert not validate["ok"] and len(validate["problems"]) == 2 and validate["suspects"] == ["127.0.0.3"]
    assert validate["all_nodes"]["world_size"] == 3 and validate["all_nodes"]["floor"] == 1e9
    assert {name: r["ok"] for name, r in validate["ring"].items()} == {
        "127.0.0.1+127.0.0.2": True,
        "127.0.0.2+127.0.0.3": False,
        "127.0.0.3+127.0.0.1": False,
    }
    assert [p["ok"] for p in validate["nodes"]["127.0.0.1"]["pairs"]] == [True]
    assert not (tmp_path / "controller" / "job1" / "manifest.json").exists()  # validation only: nothing trained
    # docs/acceptance.md's pass rule on this real failing run: each problem, and each failed node's recap
    verdict = acceptance.judge(tmp_path / "controller" / "job1", recap_text=proc.stdout)
    assert verdict["verdict"] == "failed"
    assert verdict["reasons"] == [f"validate.json: {p}" for p in validate["problems"]] + [
        "127.0.0.2: PLAY RECAP failed=1 unreachable=0",
        "127.0.0.3: PLAY RECAP failed=1 unreachable=0",
    ]


BAD_INVENTORY = {  # variable: (bad value, what the one-line refusal must say)
    "lab_runtime": ("podman", 'lab_runtime is "podman"; use docker or process'),
    "lab_rdzv_host": ("10.9.9.9", 'lab_rdzv_host is "10.9.9.9"; name a host of the group gpu_nodes'),
    "lab_nnodes": ("two", 'lab_nnodes is "two"; use a node count N or MIN:MAX'),
    "lab_rdzv_port": (70000, "lab_rdzv_port is 70000; use a TCP port, 1 to 65535"),
    "lab_nproc_per_node": ("eight", 'lab_nproc_per_node is "eight"; use a worker count of 1 or more'),
    "lab_join_timeout_seconds": (0, "lab_join_timeout_seconds is 0; use whole seconds, 1 or more"),
    "lab_target": ("-m lab bench allreduce", 'lab_target is "-m lab bench allreduce"; use a list'),
    "lab_train_overrides": ("model.width=8", 'lab_train_overrides is "model.width=8"; use a list of'),
}


def test_bad_inventory_values_are_refused_one_line_each_before_anything_is_written(tmp_path):
    proc, recap = _playbook(tmp_path, check=False, **{k: v for k, (v, _) in BAD_INVENTORY.items()})
    assert proc.returncode == 2  # ansible-playbook's "a host failed", the lab's exit code for bad input
    assert all(recap[node]["failed"] == 1 for node in NODES), proc.stdout
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("[ERROR]: Task failed")]
    for node in NODES:
        for variable, (_, said) in BAD_INVENTORY.items():
            assert sum(f"{node}: {said}" in line for line in errors) == 1, (node, variable, errors)
    assert not (tmp_path / "controller").exists() and not (tmp_path / "nodes").exists()


def test_a_node_that_cannot_reach_the_rendezvous_fails_the_play_naming_it(tmp_path):
    inventory = yaml.safe_load(LOCAL.read_text())
    # A port where nothing listens, on an address torchrun does not take for its own (0.0.0.0 is not a
    # loopback address to it, yet connects locally): 127.0.0.2 cannot reach "its" head and no packet leaves
    # the machine; the real head waits alone.
    blocked = f"0.0.0.0:{_free_port()}"
    inventory["all"]["children"]["gpu_nodes"]["hosts"]["127.0.0.2"]["lab_rdzv_endpoint"] = blocked
    # 0.0.0.0 is no loopback rendezvous to lab doctor, so this looks like a job across machines, where a host
    # name resolving to loopback fails preflight unless gloo is told its interface: here, lo
    inventory["all"]["children"]["gpu_nodes"]["vars"]["lab_env"]["GLOO_SOCKET_IFNAME"] = "lo"
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    started = time.monotonic()
    proc, recap = _playbook(tmp_path, tmp_path / "inventory.yml", check=False, lab_join_timeout_seconds=5)
    seconds = time.monotonic() - started
    assert proc.returncode != 0
    assert recap["127.0.0.2"]["failed"] == 1 and recap["127.0.0.1"]["failed"] == 1
    fatal = {line.split("]")[0].split("[")[1]: line for line in proc.stdout.splitlines() if line.startswith("fatal:")}
    assert (
        f"127.0.0.2: lab launch exited 1: lab launch: rendezvous 'job1' at {blocked} was never reached "
        "from this node (join timeout 5 s)"
    ) in fatal["127.0.0.2"]
    assert "127.0.0.1: lab launch exited 1: lab launch: rendezvous 'job1'" in fatal["127.0.0.1"]
    assert "did not complete within 5 s: expected 2 nodes, 1 arrived" in fatal["127.0.0.1"]
    # the failed nodes' logs still reached the controller; no records, so no report
    job = tmp_path / "controller" / "job1"
    assert "was never reached" in (job / "nodes" / "127.0.0.2" / "launch.log").read_text()
    assert not (job / "report.md").exists()
    # A hang guard, not a speed check: the launch timeout is a day, the join timeout 5 s.
    assert seconds < 180, f"the play took {seconds:.0f} s"
    print(f"failing play: {seconds:.0f} s")


def test_preflight_under_check_mode_then_for_real_changes_nothing_and_leaves_nothing(tmp_path):
    # --check first: Ansible skips commands unless told they are read-only (check_mode: false); lab doctor then
    # "ran" with exit 0 and no output, and preflight failed. Now every check runs under it; then the same play for
    # real. preflight only checks: neither run changes anything (so a second changes nothing), neither writes.
    for mode in (["--check"], []):
        proc, recap = _playbook(tmp_path, LOCAL, *mode, "--tags", "preflight")
        assert set(recap) == set(NODES)
        assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap.values()), (mode, proc.stdout[-3000:])
        for node in NODES:  # each node's one-line summary: its doctor ran
            assert re.search(rf"{re.escape(node)}: \d+ GPU\(s\).*torch .*lab doctor \d+ checks", proc.stdout)
        assert not (tmp_path / "controller").exists() and not (tmp_path / "nodes").exists()  # checks only
        assert not list(tmp_path.glob(".lab-workdir-probe.*"))  # each node's probe was removed


def test_preflight_fails_on_a_busy_rendezvous_port_naming_the_host(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, recap = _playbook(tmp_path, LOCAL, "--tags", "preflight", check=False, lab_rdzv_port=port)
    assert proc.returncode != 0 and recap["127.0.0.1"]["failed"] == 1
    assert f"127.0.0.1: lab doctor failed: failed  port       {port} is in use on this host" in proc.stdout


def test_preflight_refuses_a_lab_workdir_the_nodes_share_naming_them_and_the_path(tmp_path):
    # The local "nodes" share this machine's disk: one lab_workdir for both is what a /home shared by Base Command
    # Manager looks like (the other tests give each node its own folder).
    shared = tmp_path / "shared-workdir"
    proc, recap = _playbook(tmp_path, LOCAL, "--tags", "preflight", check=False, lab_workdir=str(shared))
    assert proc.returncode == 2 and all(recap[n]["failed"] == 1 for n in NODES), proc.stdout[-3000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("[ERROR]: Task failed")]
    for node, other in zip(NODES, reversed(NODES)):
        said = f"{node}: lab_workdir {shared} is one folder shared with {other} (each node saw the others' probe"
        assert sum(said in line for line in errors) == 1, (node, errors)
    assert "set lab_workdir to a node-local path" in proc.stdout + proc.stderr
    assert not list(tmp_path.glob(".lab-workdir-probe.*")) and not shared.exists()  # probes gone, nothing made


def _sshd_binary() -> str:
    """sshd, installed with apt-get (Debian's openssh-server) when missing; skip, saying why, where it cannot be."""
    import shutil

    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if sshd:
        return sshd
    if not shutil.which("apt-get"):
        pytest.skip("sshd is not installed and there is no apt-get to install openssh-server")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "openssh-server"]
    if run(install, env=env, check=False, timeout=300).returncode != 0:
        run(["apt-get", "update", "-q"], env=env, check=False, timeout=300)
        proc = run(install, env=env, check=False, timeout=300)
        if proc.returncode != 0:
            pytest.skip(f"apt-get install openssh-server failed: {proc.stderr.strip().splitlines()[-1:]}")
    return "/usr/sbin/sshd"


@pytest.fixture
def sshd_on_127_0_0_2(tmp_path):
    """An sshd of our own on 127.0.0.2 (high port, key auth only, own config and host key); yields ssh facts."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("an sshd of our own needs root (its privilege separation directory /run/sshd, logins as root)")
    sshd = _sshd_binary()
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir(mode=0o700)
    for key in ("host_key", "client_key"):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh_dir / key)])
    (ssh_dir / "authorized_keys").write_text((ssh_dir / "client_key.pub").read_text())
    port = _free_port()
    (ssh_dir / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.2
HostKey {ssh_dir / "host_key"}
AuthorizedKeysFile {ssh_dir / "authorized_keys"}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PidFile {ssh_dir / "sshd.pid"}
Subsystem sftp internal-sftp
""")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    daemon = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(ssh_dir / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=open(ssh_dir / "sshd.log", "w"),
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.2", port), timeout=1).close()
                break
            except OSError:
                assert daemon.poll() is None and time.monotonic() < deadline, (ssh_dir / "sshd.log").read_text()
                time.sleep(0.2)
        host_key = (ssh_dir / "host_key.pub").read_text().split()
        (ssh_dir / "known_hosts").write_text(f"[127.0.0.2]:{port} {host_key[0]} {host_key[1]}\n")
        yield {
            "ansible_connection": "ssh",
            "ansible_host": "127.0.0.2",
            "ansible_port": port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(ssh_dir / "client_key"),
            # host key checking stays on: the node's key is in a known_hosts file of our own
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={ssh_dir / 'known_hosts'}",
            "ansible_ssh_args": "-C -o ControlMaster=no",  # no multiplexing master outliving the test
            "ansible_python_interpreter": PYTHON,
        }
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


def test_a_limit_of_two_of_three_nodes_one_over_real_ssh_trains_them_with_the_first_of_them_as_head(
    tmp_path, sshd_on_127_0_0_2
):
    """`--limit` is how an operator drops a bad node: the head and --nnodes come from the hosts that play. Three
    nodes, the group's first (127.0.0.1, the controller) left out: 127.0.0.2, reached over real SSH (an sshd of the
    test's own, key auth), is the head, 127.0.0.3 the other node, and the world has 2 nodes."""
    inventory = yaml.safe_load(LOCAL.read_text())
    hosts = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    group = inventory["all"]["children"]["gpu_nodes"]["vars"]
    local = {
        "ansible_connection": group.pop("ansible_connection"),
        "ansible_python_interpreter": group.pop("ansible_python_interpreter"),
    }
    hosts["127.0.0.1"].update(local)
    hosts["127.0.0.2"].update(sshd_on_127_0_0_2)
    hosts["127.0.0.3"] = {"lab_node_address": "127.0.0.3", **local}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    playing = ["127.0.0.2", "127.0.0.3"]
    started = time.monotonic()
    proc, recap = _playbook(
        tmp_path,
        tmp_path / "inventory.yml",
        "--limit",
        ",".join(playing),
        lab_train_overrides=["model.width=8", "train.max_steps=2"],
    )
    seconds = time.monotonic() - started
    assert set(recap) == set(playing), proc.stdout[-3000:]
    assert all(r["failed"] == r["unreachable"] == 0 for r in recap.values()), proc.stdout[-3000:]
    assert "Accepted publickey for" in (tmp_path / "ssh" / "sshd.log").read_text()  # really over SSH, with the key
    job = tmp_path / "controller" / "job1"
    nodes = json.loads((job / "nodes.json").read_text())
    assert (
        nodes["nnodes"] == "2"
        and nodes["rdzv_endpoint"].startswith("127.0.0.2:")
        and set(nodes["launch"]) == set(playing)
    )
    manifest = json.loads((job / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and sorted(r["node_rank"] for r in manifest["ranks"]) == [0, 1]
    assert (job / "nodes" / "127.0.0.2" / "launch.log").stat().st_size > 0  # fetched over SSH
    assert (job / "report.md").exists()
    assert not (tmp_path / "nodes" / "127.0.0.1").exists()  # the node left out was never touched
    print(f"--limit play, 2 of 3 nodes, the head over ssh: {seconds:.0f} s")
