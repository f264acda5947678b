"""The GPUs a process was meant to have, known from outside torch: what Slurm gave its step, what its Slurm node
has, what the node's NVIDIA driver has. `dist.device=auto` asks here before it settles for the CPU: a job that
expected GPUs and trained on the CPU is a failed job (it would report "completed", and `lab validate` would judge
a DGX as a CPU box), not a slow one.

Why each source: Slurm gives a step only the GRES its job asked for, and with ConstrainDevices the step sees no
other GPU, so a job submitted without --gpus-per-node on a GPU node sees none (the batch scripts export each node's
configured GPU count as LAB_SLURM_NODE_GPUS, from `scontrol show node`: its Gres). The driver's own list,
/proc/driver/nvidia/gpus, is procfs: it shows the node's GPUs even where the device files are hidden (a
cgroup, a container started without --gpus). A place that hides the GPUs on purpose says so with an empty
CUDA_VISIBLE_DEVICES (a CPU seat of a workshop room), and is left alone.

>>> unseen({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0,1"}, driver=Path("/nonexistent"))
'Slurm gave this step GPU(s) 0,1 (SLURM_STEP_GPUS)'
>>> print(unseen({"SLURM_JOB_ID": "7", "SLURM_NODEID": "1", NODE_GPUS_VARIABLE: "8 8"}, driver=Path("/nonexistent")))
Slurm's node 1 of this job has 8 GPU(s) (its Gres) but the job asked for none: submit with --gpus-per-node=8
>>> unseen({"CUDA_VISIBLE_DEVICES": ""}, driver=Path("/nonexistent")) is None
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from lab.run.cluster import slurm

NODE_GPUS_VARIABLE = "LAB_SLURM_NODE_GPUS"  # the batch scripts': each node's GPU Gres count, in the job's node order
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the NVIDIA driver has bound


def slurm_given(env: Mapping[str, str]) -> str | None:
    """The GPUs Slurm gave this process on this node, said with where that shows, or None. A step (srun) has them
    when Slurm gave them to the step (Allocation.step_gpus); the job's alone, in a step, are not the step's."""
    job = slurm.allocation(env)
    if job is None:
        return None
    if job.step_gpus:
        return f"Slurm gave this step GPU(s) {job.step_gpus} (SLURM_STEP_GPUS)"
    if job.job_gpus and job.in_step:
        return (
            f"this job holds GPU(s) {job.job_gpus} on this node (SLURM_JOB_GPUS; --exclusive gives a job its "
            f"nodes' GPUs) but Slurm gave its step none: submit with --gpus-per-node"
        )
    if job.job_gpus:
        return f"Slurm gave this job GPU(s) {job.job_gpus} (SLURM_JOB_GPUS)"
    return f"Slurm gave this job {job.gpus_on_node} GPU(s) (SLURM_GPUS_ON_NODE)" if job.gpus_on_node else None


def slurm_node_gpus(env: Mapping[str, str]) -> int:
    """This node's GPUs in Slurm's configuration (its Gres), as the batch script exported them; 0 when unknown."""
    job = slurm.allocation(env)
    counts = env.get(NODE_GPUS_VARIABLE, "").split()
    if job is None or job.node_id >= len(counts) or not counts[job.node_id].isdigit():
        return 0
    return int(counts[job.node_id])


def driver_gpus(driver: Path = DRIVER_GPUS) -> int:
    """How many GPUs the node's NVIDIA driver has bound (0 without the driver, or where /proc cannot be read)."""
    try:
        return sum(1 for _ in driver.iterdir())
    except OSError:
        return 0


def unseen(env: Mapping[str, str] | None = None, driver: Path = DRIVER_GPUS) -> str | None:
    """Why this process should have GPUs, when something outside torch says it should; None when nothing does."""
    env = os.environ if env is None else env
    given = slurm_given(env)
    if given:
        return given
    node = slurm_node_gpus(env)
    if node:
        return (
            f"Slurm's node {env.get('SLURM_NODEID', '0')} of this job has {node} GPU(s) (its Gres) but the job "
            f"asked for none: submit with --gpus-per-node={node}"
        )
    if env.get("CUDA_VISIBLE_DEVICES") == "":  # hidden on purpose
        return None
    bound = driver_gpus(driver)
    return f"this node's NVIDIA driver has {bound} GPU(s) ({driver})" if bound else None
