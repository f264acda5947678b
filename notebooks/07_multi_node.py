# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 7: more than one node
#
# Lecture 3 of the course, hands-on on a DGX, running at scale: past one machine, nothing changes in the training
# code; what changes is how the processes find each other. Every node runs `torchrun` with the same `--nnodes`,
# `--rdzv-id` and `--rdzv-endpoint` (the head node's address and port). They meet in a c10d rendezvous hosted on the
# head: when every node has arrived, each gets its node rank, every worker its global rank, and the world trains as
# one. A node that never arrives must not leave the others waiting forever: the join timeout ends the job with a
# message. Which hosts take part, and with which settings, is an Ansible inventory; the playbook checks the fabric
# (the validate play) before it launches.
#
# You will:
# 1. read the two inventories the lab ships: two "nodes" on this machine, and a DGX cluster template;
# 2. start two `lab launch` processes on this machine, "node" 127.0.0.1 and "node" 127.0.0.2, that meet in one
#    rendezvous and train as one world of 2;
# 3. start one node alone and watch it give up at its join timeout, saying why in one line;
# 4. see the validate play's tasks and the `validate.json` it writes.
#
# On a CPU each node runs one gloo worker of the `smoke` config (a ResNet-18 of width 8, 4 steps); on a GPU server
# each node gets half of the GPUs and runs `workshop-gpu` (NCCL). Every command is one you can type in a terminal.

# %%
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from lab.course.teaching import lesson

folder = lesson.output_dir("07-multi-node")
plan = lesson.plan(queue=False)  # fewer than 2 GPUs: a CPU worker per "node" (the room's GPU queue is for short runs)
config = plan.config
per_node = plan.ranks // 2 if plan.gpu else 1
print(plan.why)
print(f"2 nodes x {per_node} worker(s), config {config}, results in {folder}")


# %% [markdown]
# ## 1. The inventory: which hosts, which settings
# `playbooks/multinode.yml` runs on the hosts of the `gpu_nodes` group; the first host is the rendezvous head. The
# local inventory makes two "nodes" of this machine: 127.0.0.1 and 127.0.0.2 are both loopback addresses (Linux
# answers on all of 127.0.0.0/8), Ansible reaches them without SSH (`ansible_connection: local`), and each runs one
# gloo worker in its own folder. The DGX template has real hosts: `ansible_host` is where Ansible connects (the
# management network), `lab_node_address` is the node's address on the cluster network, the one torchrun binds
# (`--local-addr`) and, for the head, the rendezvous endpoint. NCCL's interfaces and InfiniBand cards come in
# `lab_env`.

# %%
inventories = {}
for name in ("local.yml", "dgx.example.yml"):
    path = lesson.checkout_file(f"playbooks/inventory/{name}")
    if path is None:
        print(f"playbooks/inventory/{name} is not in this checkout (the jupyter image mounts notebooks/ only)")
        continue
    inventories[name] = yaml.safe_load(path.read_text())["all"]["children"]["gpu_nodes"]
if "local.yml" in inventories:
    print(lesson.checkout_file("playbooks/inventory/local.yml").read_text())
keys = ["ansible_connection", "lab_runtime", "lab_workdir", "lab_nproc_per_node", "lab_rdzv_port",
        "lab_join_timeout_seconds", "lab_train_config", "lab_env"]
rows = [{"inventory": name, "host": host, "ansible_host": (v or {}).get("ansible_host", "-"),
         "lab_node_address": (v or {}).get("lab_node_address", "-")}
        for name, group in inventories.items() for host, v in group["hosts"].items()]
lesson.table(rows, ["inventory", "host", "ansible_host", "lab_node_address"])
lesson.table([{"variable": k, **{name: str(group["vars"].get(k, "(default)")) for name, group in inventories.items()}}
              for k in keys], ["variable", *inventories])

# %% [markdown]
# ## 2. Two nodes, one rendezvous, one world
# What the playbook's launch play runs on each node is `lab launch` (torchrun with the lab's options). Here both
# "nodes" start side by side, the same command but `--local-addr`: the head's c10d store listens at
# `127.0.0.1:PORT`, node 127.0.0.2 connects to it, and once both have arrived torchrun gives each a node rank
# and starts its workers. Each node writes into its own folder, as two machines would; only global rank 0 keeps the
# run's records, so only one of them gets a `manifest.json`.

# %%
endpoint = f"127.0.0.1:{lesson.free_ports()}"
started = time.time()
nodes = {}
for name, addr, visible in (("a", "127.0.0.1", range(per_node)), ("b", "127.0.0.2", range(per_node, 2 * per_node))):
    env = {"OMP_NUM_THREADS": "1"}  # lesson.start adds the plan's (on a 1-GPU host: the GPU hidden)
    if plan.gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible))  # each "node" its own half of the GPUs
    sizes = [] if plan.gpu else ["--set", "model.width=8", "--set", "train.max_steps=4"]
    command = [sys.executable, "-m", "lab", "launch", "--nnodes", "2", "--nproc-per-node", str(per_node),
               "--rdzv-endpoint", endpoint, "--rdzv-id", "meet", "--local-addr", addr, "--join-timeout", "60",
               "--", "-m", "lab", "train", "--config", config, *sizes, "--set", "checkpoint.save=false",
               "--set", f"run.output_dir={folder / ('node-' + name)}"]
    print(f"node {name} ({addr}): $ {' '.join(command)}", flush=True)
    nodes[name] = lesson.start(command, env=env)


def relay(name: str, proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        print(f"[node {name}] {line}", end="", flush=True)


relays = [threading.Thread(target=relay, args=item) for item in nodes.items()]
for t in relays:
    t.start()
codes = {name: proc.wait(timeout=600) for name, proc in nodes.items()}
for t in relays:
    t.join()
print(f"exit codes {codes}, {time.time() - started:.0f} s")
if any(codes.values()):
    raise lesson.NotWhatYouShouldSee(f"the two nodes did not both finish: exit codes {codes}")

# %% [markdown]
# The manifest, written by global rank 0 after every rank reported in, lists every rank with its node rank and
# host. Here both hosts are this machine; on a cluster the `host` column names two machines.

# %%
manifests = sorted(folder.glob("node-*/*/manifest.json"))
for path in manifests:
    print(f"records kept on node {path.parent.parent.name[-1]}: {path.parent}")
manifest = lesson.results(manifests[0]) if manifests else {"world_size": 0, "ranks": []}
lesson.table(manifest["ranks"], ["global_rank", "node_rank", "local_rank", "host", "device"])
print(f"world_size {manifest['world_size']}, backend {manifest.get('backend')}, run id {manifest.get('run_id')}")

# %% [markdown]
# ## 3. A node alone: the join timeout
# Start the head node only, with a 5 s join timeout, and the second node never comes. Without a timeout torchrun
# would wait 600 s (its default); with one, `lab launch` ends with exit code 1 and one line that names the
# rendezvous, its endpoint and how many nodes arrived, and no worker ever starts. Above it torchrun prints its own
# traceback (`RendezvousTimeoutError`, which says nothing of why); the last line is the one to read. On a cluster
# that line points at the node to look at (its network, its firewall, a wrong `--rdzv-endpoint`).

# %%
alone_endpoint = f"127.0.0.1:{lesson.free_ports()}"
alone_started = time.time()
alone = lesson.lab("launch", "--nnodes", "2", "--rdzv-endpoint", alone_endpoint, "--rdzv-id", "alone",
                   "--join-timeout", "5", "--", "-m", "lab", "train", "--config", "smoke",
                   "--set", f"run.output_dir={folder / 'alone'}", check=False, env={"OMP_NUM_THREADS": "1"})
alone_seconds = time.time() - alone_started
last_line = alone.stdout.strip().splitlines()[-1] if alone.stdout.strip() else ""
print(f"\nexit code {alone.returncode} after {alone_seconds:.0f} s; its last line:\n{last_line}")

# %% [markdown]
# ## 4. The validate play: the fabric before the job
# Before it launches, `multinode.yml` reads each node's facts (GPUs, NVLink, InfiniBand, DCGM), measures all-reduce
# bus bandwidth on each node (all its GPUs at once, or two CPU processes) and across all nodes, and `lab validate`
# judges each against its platform's floor (or `lab_validate_min_busbw_gbps`); a node that misses one fails the
# play, by name, before any training. On two local nodes it took 29 s here (about 75 s under load), more than this
# lesson's budget, so the cell below only lists the play's tasks. Run it in a terminal:
#
# ```sh
# .venv/bin/ansible-playbook -i playbooks/inventory/local.yml playbooks/multinode.yml --tags validate
# ```
#
# It writes `runs/<run id>/validate.json` on the controller. Its shape, from a run of that command here (trimmed):
#
# ```json
# {"check": "validate", "platform": "ansible", "run_id": "job1", "ok": true, "problems": [],
#  "nodes": {"127.0.0.1": {"gpus": 0, "platform": {"key": "cpu", "name": "CPU only (no NVIDIA GPU)"},
#                          "floors": {"node": 0.01, "pair": 0.0001, "nodes": 0.0001},
#                          "pairs": [{"pair": "cpu", "busbw": 1.30, "floor": 0.0001, "ok": true,
#                                     "judged_at": "largest size 1 MiB (the run had none >= 1 GiB)"}],
#                          "facts": {"...": "what scripts/node-facts.sh found: GPUs, NVLink, InfiniBand, DCGM"},
#                          "checks": [{"name": "gpu-checks", "status": "not applicable", "...": "..."}]},
#            "127.0.0.2": {"...": "the same for the second node"}},
#  "all_nodes": {"hosts": ["127.0.0.1", "127.0.0.2"], "world_size": 2, "busbw": 0.80, "floor": 0.0001, "ok": true},
#  "ring": {}, "ring_needed": false, "suspects": [],
#  "runs": {"127.0.0.1": {"node": {"...": "..."}, "nodes": {"last_line": "# Avg bus bandwidth    : 0.346251"}}},
#  "definitions": {"busbw": "...", "judged": "...", "floor": "...", "host_device": "..."}}
# ```
#
# `busbw` is in GB/s (1e9 bytes), judged at the messages of 1 GiB and more (GPUs), or at the largest size the run
# had (here, CPUs). On a DGX the node's platform (8 x H100 on NVSwitch, ...) sets its floors, and each GPU, NVLink,
# InfiniBand, GPUDirect RDMA, DCGM and XID check is a line of `checks`. `ring` holds the pairs of nodes measured
# around a ring when all nodes together missed the floor, and `suspects` the nodes that are in two slow pairs.

# %%
ansible = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which("ansible-playbook")
playbook = lesson.checkout_file("playbooks/multinode.yml")
validate_tasks = []
if ansible and playbook and "local.yml" in inventories:
    listed = lesson.run(ansible, "-i", str(lesson.checkout_file("playbooks/inventory/local.yml")), str(playbook),
                        "--list-tasks", "--tags", "validate", env={"ANSIBLE_NOCOLOR": "1"})
    validate_tasks = [line.strip() for line in listed.stdout.splitlines() if line.strip().startswith("validate :")]
else:
    print("ansible-playbook or playbooks/ is not here (the jupyter image has neither): run this part from a checkout")

# %% [markdown]
# ## What you should see
# The two nodes meet: one world of size 2, node ranks 0 and 1, one set of records (on the node where global rank 0
# landed). The lone node exits 1 a few seconds after its 5 s join timeout (plus the time to start Python) with
# `lab launch: rendezvous 'alone' at 127.0.0.1:PORT did not complete within 5 s: expected 2 nodes, 1 arrived`, and
# never starts a worker. The local inventory has the two loopback "nodes", one worker each; the validate play lists
# its tasks (an all-reduce per pair, then over all nodes, then validate.json).
#
# **Ask:** the two-node job hangs at the start on a real cluster, and after the join timeout the head says
# "expected 2 nodes, 1 arrived". Which node is missing, and what do you check first?

# %%
node_ranks = sorted(r["node_rank"] for r in manifest["ranks"])
lesson.expect(manifest["world_size"] == 2 * per_node and node_ranks == sorted([0, 1] * per_node),
              f"the two nodes trained as one world: world_size {manifest['world_size']}, node ranks {node_ranks}")
lesson.expect(len(manifests) == 1, f"global rank 0 alone keeps the records: one manifest, on "
              f"{', '.join(p.parent.parent.name for p in manifests) or 'no node'}")
expected_line = (f"lab launch: rendezvous 'alone' at {alone_endpoint} did not complete within 5 s: "
                 "expected 2 nodes, 1 arrived")
lesson.expect(alone.returncode == 1 and last_line == expected_line,
              f"the lone node fails (exit {alone.returncode}) naming the rendezvous: {last_line!r}")
lesson.expect(5 <= alone_seconds < 60 and not list((folder / "alone").glob("*/manifest.json")),
              f"it gave up after its 5 s join timeout ({alone_seconds:.0f} s with Python's start), no worker started")
local = inventories.get("local.yml")
if local is not None:
    addresses = sorted(v["lab_node_address"] for v in local["hosts"].values())
    inventory_ok = (addresses == ["127.0.0.1", "127.0.0.2"] and local["vars"]["lab_nproc_per_node"] == 1
                    and len(validate_tasks) >= 5 and any("every node together" in t for t in validate_tasks))
    inventory_says = (f"the local inventory's nodes are {addresses}, one worker each; the validate play has "
                      f"{len(validate_tasks)} tasks, an all-reduce over every node among them")
else:  # the jupyter image: no playbooks/ to read
    inventory_ok = manifest.get("hosts") == [socket.gethostname()]
    inventory_says = f"(no playbooks/ here, inventory skipped) both nodes ran on this host: {manifest.get('hosts')}"
lesson.expect(inventory_ok, inventory_says)
