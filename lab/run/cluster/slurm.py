"""Slurm's view of a job, read from the variables sbatch and srun set, in this one place (as torchrun_env is
torchrun's). torch-free: the CLI asks before it imports torch.

The lab runs under Slurm one way: one `srun` task per node, each running `lab launch --slurm`, which starts
torchrun there with the c10d rendezvous at the allocation's first node (slurm/lab.sbatch). What a Slurm (or MPI)
user may type instead, one task per rank (`srun -n16 lab train`, `mpirun -np 16 lab train`), starts processes
that torchrun did not: `foreign_launch` names that, and the lab refuses it in one line rather than train 16
independent copies of world size 1.

    >>> expand_hostlist("dgx[01-03,07],login1")
    ['dgx01', 'dgx02', 'dgx03', 'dgx07', 'login1']
    >>> tasks_per_node("8(x2),4")
    [8, 8, 4]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload

from lab.errors import LabError
from lab.run.cluster import torchrun_env

# The batch script resolves every node's address once (scontrol show node: NodeAddr), outside any container, and
# passes them on here in the allocation's order; a container started by pyxis seldom has scontrol.
ADDRESSES_VARIABLE = "LAB_SLURM_NODE_ADDRESSES"


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compact host list ("n[1-2]", "dgx[01-04,09]") as names, zero padding kept; what `scontrol show
    hostnames` prints, without needing scontrol."""
    names: list[str] = []
    for prefix, ranges, suffix, plain in re.findall(r"([^,\[]*)\[([^\]]*)\]([^,]*)|([^,]+)", spec):
        if plain:
            names.append(plain)
            continue
        for item in ranges.split(","):
            first, _, last = item.partition("-")
            width = len(first)
            names += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(first), int(last or first) + 1)]
    return names


def tasks_per_node(spec: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE ("2(x3),1") as one count per node."""
    counts: list[int] = []
    for item in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if found:
            counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


@dataclass(frozen=True)
class Allocation:
    """The job this process runs in, and the step (srun) when there is one."""

    job_id: str
    cluster: str
    nodes: list[str]  # the job's nodes, in Slurm's order (SLURM_JOB_NODELIST)
    node_id: int  # this node's place in `nodes` (SLURM_NODEID)
    node_name: str  # SLURMD_NODENAME
    in_step: bool  # started by srun (SLURM_STEP_ID), not the batch script itself
    step_tasks: int  # tasks of the step (SLURM_STEP_NUM_TASKS; the job's outside a step)
    step_tasks_per_node: list[int]
    task_id: int  # SLURM_PROCID
    local_id: int  # SLURM_LOCALID: this task's index among the step's tasks on this node
    gpus_on_node: int | None  # SLURM_GPUS_ON_NODE: GPUs the job was given on this node (None: no GRES asked)
    job_gpus: str | None  # SLURM_STEP_GPUS / SLURM_JOB_GPUS: their indices on the node
    # SLURM_STEP_GPUS alone: what this step was given. A job with --exclusive and no GPU request holds its nodes'
    # GPUs (SLURM_JOB_GPUS, inherited by its steps) while each srun step gets none (Slurm 22.05, measured).
    step_gpus: str | None
    restart_count: int  # SLURM_RESTART_COUNT: times the job was requeued

    @property
    def tasks_on_this_node(self) -> int:
        counts = self.step_tasks_per_node
        return counts[self.node_id] if self.node_id < len(counts) else 1

    def describe(self) -> str:
        gpus = "no GPUs requested" if self.gpus_on_node is None else f"{self.gpus_on_node} GPU(s) on this node"
        step = (
            f"step task {self.task_id} of {self.step_tasks}, {self.tasks_on_this_node} on this node"
            if self.in_step
            else "the batch script (no srun step)"
        )
        return (
            f"job {self.job_id} on {self.cluster}: {len(self.nodes)} node(s) {','.join(self.nodes)}; "
            f"this is {self.node_name} (node {self.node_id}), {step}; {gpus}"
        )


def record(env: Mapping[str, str] | None = None) -> dict | None:
    """What a run's manifest keeps of its Slurm job (None outside Slurm)."""
    job = allocation(env)
    if job is None:
        return None
    return {"job_id": job.job_id, "cluster": job.cluster, "nodes": job.nodes, "restart_count": job.restart_count}


@overload
def _int(env: Mapping[str, str], *names: str, default: int) -> int: ...
@overload
def _int(env: Mapping[str, str], *names: str, default: None = None) -> int | None: ...
def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return default


def allocation(env: Mapping[str, str] | None = None) -> Allocation | None:
    """The Slurm job this process belongs to, None outside Slurm."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    in_step = "SLURM_STEP_ID" in env or "SLURM_STEPID" in env
    step_tasks = _int(env, "SLURM_STEP_NUM_TASKS" if in_step else "SLURM_NTASKS", "SLURM_NTASKS", default=1)
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE" if in_step else "SLURM_TASKS_PER_NODE", ""))
    gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS")
    return Allocation(
        job_id=job_id,
        cluster=env.get("SLURM_CLUSTER_NAME", "slurm"),
        nodes=nodes,
        node_id=_int(env, "SLURM_NODEID", default=0),
        node_name=env.get("SLURMD_NODENAME", "?"),
        in_step=in_step,
        step_tasks=step_tasks,
        step_tasks_per_node=per_node or [step_tasks],
        task_id=_int(env, "SLURM_PROCID", default=0),
        local_id=_int(env, "SLURM_LOCALID", default=0),
        gpus_on_node=_int(env, "SLURM_GPUS_ON_NODE"),
        job_gpus=gpus,
        step_gpus=env.get("SLURM_STEP_GPUS") or None,
        restart_count=_int(env, "SLURM_RESTART_COUNT", default=0),
    )


def foreign_launch(env: Mapping[str, str] | None = None) -> str | None:
    """The one line refusing a process that Slurm or MPI started as one rank of several, without torchrun;
    None when torchrun started it, or when nothing says it has peers.

    >>> print(foreign_launch({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2",
    ...                       "SLURM_PROCID": "1"}))
    this process is task 1 of 2 of a Slurm step (srun -n 2) without torchrun: each task would train alone, as world
    size 1; run one task per node that starts torchrun there: `srun --ntasks-per-node=1 lab launch --slurm
    --nproc-per-node GPUS_PER_NODE -- -m lab train ...` (slurm/lab.sbatch does; docs/slurm.md)
    >>> foreign_launch({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2",
    ...                 "LOCAL_RANK": "0", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "7"}) is None
    True
    >>> foreign_launch({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}) is None  # the batch script: one process
    True
    >>> print(foreign_launch({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}).split(":")[0])
    this process is rank 0 of 4 of an MPI job (mpirun -np 4) without torchrun
    """
    env = os.environ if env is None else env
    if torchrun_env.launched_by_torchrun(env):  # torchrun's worker, wherever torchrun itself came from
        return None
    launch = (
        "`srun --ntasks-per-node=1 lab launch --slurm --nproc-per-node GPUS_PER_NODE -- -m lab train ...` "
        "(slurm/lab.sbatch does; docs/slurm.md)"
    )
    job = allocation(env)
    if job is not None and job.in_step and job.step_tasks > 1:
        return (
            f"this process is task {job.task_id} of {job.step_tasks} of a Slurm step (srun -n {job.step_tasks}) "
            f"without torchrun: each task would train alone, as world size 1; run one task per node that starts "
            f"torchrun there: {launch}"
        )
    for size, rank, what in (
        ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "an MPI job (mpirun"),
        ("PMI_SIZE", "PMI_RANK", "an MPI or PMI job (mpirun/mpiexec"),
    ):
        if _int(env, size, default=1) > 1:
            return (
                f"this process is rank {env.get(rank, '?')} of {env[size]} of {what} -np {env[size]}) without "
                f"torchrun: each process would train alone, as world size 1; torchrun replaces mpirun for the "
                f"lab: run one `lab launch` per node (`mpirun -np NODES --map-by ppr:1:node lab launch --nnodes "
                f"NODES --rdzv-endpoint HEAD:29400 ...`), or under Slurm {launch}"
            )
    return None


def node_addresses(job: Allocation, env: Mapping[str, str] | None = None) -> list[str]:
    """Every node's address, in the allocation's order: the batch script's LAB_SLURM_NODE_ADDRESSES, else
    `scontrol show node` (NodeAddr), else the names themselves (which may not resolve: say so in the fix)."""
    env = os.environ if env is None else env
    given = env.get(ADDRESSES_VARIABLE, "").split()
    if given:
        if len(given) != len(job.nodes):
            raise LabError(
                f"{ADDRESSES_VARIABLE}: {len(given)} address(es) for the job's {len(job.nodes)} nodes "
                f"({','.join(job.nodes)}); give one per node, in SLURM_JOB_NODELIST's order"
            )
        return given
    if shutil.which("scontrol"):
        found = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(job.nodes)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        addresses = dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)", found))
        if all(name in addresses for name in job.nodes):
            return [addresses[name] for name in job.nodes]
    return list(job.nodes)


@dataclass(frozen=True)
class Placement:
    """What `lab launch --slurm` fills in from the allocation."""

    nnodes: int
    endpoint: str
    local_addr: str
    run_id: str


def placement(port: int, env: Mapping[str, str] | None = None) -> Placement:
    """Where this node's torchrun meets the others: the first node's address, this node's own, one id.

    Refuses (one line) anything but one srun task per node: a second task on a node would start a second torchrun
    there, and the rendezvous would count it as another node."""
    env = os.environ if env is None else env
    job = allocation(env)
    if job is None:
        raise LabError(
            "--slurm: no Slurm job here (SLURM_JOB_ID is unset); run it under srun inside sbatch or "
            "salloc, or give --nnodes and --rdzv-endpoint yourself"
        )
    if not job.in_step:
        raise LabError(
            f"--slurm: this is job {job.job_id}'s batch script, not a step; start it on every node: "
            f"`srun --ntasks-per-node=1 lab launch --slurm ...`"
        )
    if any(count != 1 for count in job.step_tasks_per_node) or job.step_tasks != len(job.nodes):
        raise LabError(
            f"--slurm: step of job {job.job_id} runs {job.step_tasks} task(s) on {len(job.nodes)} "
            f"node(s) (SLURM_STEP_TASKS_PER_NODE={env.get('SLURM_STEP_TASKS_PER_NODE', '?')}); run "
            f"exactly one per node: srun --ntasks-per-node=1 (torchrun starts the ranks)"
        )
    addresses = node_addresses(job, env)
    return Placement(
        nnodes=len(job.nodes),
        endpoint=f"{addresses[0]}:{port}",
        local_addr=addresses[job.node_id],
        run_id=f"slurm-{job.cluster}-{job.job_id}",
    )
