"""`lab doctor` inside a Slurm job: the `slurm` line (the allocation as this task sees it) and the `gpu-share`
line (fails when this task must see a GPU that another task of its step on this node sees too). Pure functions
of the facts, so a test can give them any node; lab.machine.health.doctor gathers the facts and prints the lines."""

from __future__ import annotations

from typing import Any

from lab.run.cluster import nvml, slurm
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, Check


def count_devices(spec: str | None) -> int | None:
    """How many devices a device list names: CUDA_VISIBLE_DEVICES ("3", "0,1", "GPU-8f0c...,GPU-1a2b...") or
    SLURM_STEP_GPUS / SLURM_JOB_GPUS (indices, ranges allowed); None for an unset list, 0 for an empty one
    (CUDA_VISIBLE_DEVICES="" hides every GPU). A name given twice is one device.

    >>> count_devices("0,1,2,3"), count_devices("GPU-8f0c-11aa,GPU-1a2b-22bb"), count_devices("0-3,6")
    (4, 2, 5)
    >>> count_devices(""), count_devices(None)
    (0, None)
    """
    if spec is None:
        return None
    names: set[str] = set()
    for item in (part.strip() for part in spec.split(",")):
        first, dash, last = item.partition("-")
        if dash and first.isdigit() and last.isdigit():  # a Slurm index range; a UUID is never digits-dash-digits
            names.update(str(n) for n in range(int(first), int(last) + 1))
        elif item:
            names.add(item)
    return len(names)


def node_gpu_count(visible: str | None, torch_count: int) -> int | None:
    """The GPUs of this node as the doctor counts them: NVML's count (blind to CUDA_VISIBLE_DEVICES), else
    torch's when CUDA_VISIBLE_DEVICES is unset (then torch sees the whole node); None when neither can tell."""
    return nvml.device_count() or (torch_count if visible is None else None)


def seen_gpus(visible: str | None, node_gpus: int | None) -> int:
    """GPUs this task sees: CUDA_VISIBLE_DEVICES's list, or every GPU of the node when it is unset."""
    count = count_devices(visible)
    return (node_gpus or 0) if count is None else count


def step_gpu_pool(job: slurm.Allocation, node_gpus: int | None) -> int | None:
    """The GPUs that the step's tasks on this node draw from: the job's on this node as Slurm gives them
    (SLURM_GPUS_ON_NODE, else SLURM_STEP_GPUS/SLURM_JOB_GPUS's list), else the node's as the doctor counts them.
    Slurm's number comes first because a task only reaches the job's GPUs (cgroups), however many the node has."""
    return job.gpus_on_node or count_devices(job.job_gpus) or node_gpus


def slurm_facts(job: slurm.Allocation, visible: str | None, node_gpus: int | None) -> dict[str, Any]:
    """What the JSON's "slurm" key holds: the allocation, and the GPUs this task sees."""
    return {
        "job_id": job.job_id,
        "cluster": job.cluster,
        "nodes": job.nodes,
        "node_count": len(job.nodes),
        "node_name": job.node_name,
        "node_id": job.node_id,
        "in_step": job.in_step,
        "step_tasks": job.step_tasks,
        "tasks_on_this_node": job.tasks_on_this_node,
        "task_id": job.task_id,
        "local_id": job.local_id,
        "gpus_on_node": job.gpus_on_node,
        "job_gpus": job.job_gpus,
        "cuda_visible_devices": visible,
        "gpus_seen": seen_gpus(visible, node_gpus),
        "node_gpus": node_gpus,
    }


def check_slurm(job: slurm.Allocation, visible: str | None, node_gpus: int | None) -> Check:
    """The allocation in one line: Slurm's own description, the GPUs given here, the GPUs this task sees."""
    given = f"SLURM_STEP_GPUS/SLURM_JOB_GPUS={job.job_gpus}" if job.job_gpus else "no GPU indices from Slurm"
    seen = seen_gpus(visible, node_gpus)
    sees = (
        f"CUDA_VISIBLE_DEVICES={visible} ({seen} GPU(s))"
        if visible is not None
        else f"CUDA_VISIBLE_DEVICES unset: all {seen} GPU(s) of the node"
        if seen
        else "no GPU (CUDA_VISIBLE_DEVICES unset, none found on the node)"
    )
    return Check("slurm", HELD, f"{job.describe()} ({given}); this task sees {sees}")


def check_gpu_share(job: slurm.Allocation, visible: str | None, node_gpus: int | None) -> Check:
    """Does this task see a GPU that another task of its step on this node sees too? A task cannot see its
    siblings' CUDA_VISIBLE_DEVICES, so count instead (pigeonhole): N tasks that each see S GPUs out of a pool of
    P share one when N * S > P. Always a line under Slurm: a "not applicable" line says why the rule does not apply (the
    batch script, one task on the node, no GPU) or that it passed; `warn` when the pool cannot be counted.
    A held line proves no sharing is forced, not that none happens (tasks given the same list by hand pass).

    >>> job = slurm.allocation({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8",
    ...                         "SLURM_STEP_TASKS_PER_NODE": "8", "SLURMD_NODENAME": "dgx01",
    ...                         "SLURM_GPUS_ON_NODE": "8"})
    >>> check_gpu_share(job, "0,1,2,3,4,5,6,7", 8).verdict, check_gpu_share(job, "3", 8).verdict
    ('failed', 'held')
    """
    tasks, seen = job.tasks_on_this_node, seen_gpus(visible, node_gpus)
    shown = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "CUDA_VISIBLE_DEVICES unset: the whole node"
    if not job.in_step:
        return Check(
            "gpu-share", NOT_APPLICABLE, "does not apply: this is the batch script, one process (no srun step)"
        )
    if tasks <= 1:
        return Check(
            "gpu-share",
            NOT_APPLICABLE,
            f"does not apply: one task of the step on {job.node_name}, no sibling to share a GPU with",
        )
    if seen == 0:
        return Check("gpu-share", NOT_APPLICABLE, f"does not apply: this task sees no GPU ({shown})")
    pool = step_gpu_pool(job, node_gpus)
    if not pool:
        return Check(
            "gpu-share",
            HELD,
            f"cannot tell whether {tasks} tasks on {job.node_name} share GPUs: "
            f"each sees {seen} ({shown}), but the node's GPU count is unknown",
            "request GPUs through Slurm (--gpus-per-node, --gres=gpu:N) so SLURM_GPUS_ON_NODE is set, "
            "or install nvidia-ml-py",
        )
    if tasks * seen > pool:
        return Check(
            "gpu-share",
            FAILED,
            f"{tasks} tasks of this step on {job.node_name} each see {seen} GPU(s) ({shown}) out of "
            f"{pool}: {tasks} x {seen} > {pool}, so some GPU is seen by more than one task",
            "give each task its own GPU with `srun --gpus-per-task=1`, or run one task per node that "
            "gives each rank its own GPU: `srun --ntasks-per-node=1 lab launch --slurm ...`",
        )
    return Check(
        "gpu-share",
        HELD,
        f"{tasks} tasks on {job.node_name} each see {seen} GPU(s) ({shown}) out of "
        f"{pool}: {tasks} x {seen} <= {pool}, no GPU need be seen twice",
    )


def check_slurm_job(
    job: slurm.Allocation | None, visible: str | None, node_gpus: int | None
) -> tuple[list[Check], dict[str, Any] | None]:
    """The `slurm` and `gpu-share` lines and the JSON's "slurm" facts; no line and None outside Slurm.
    A pure function of the facts, so a test can give it any node (this machine may have no GPU)."""
    if job is None:
        return [], None
    checks = [check_slurm(job, visible, node_gpus), check_gpu_share(job, visible, node_gpus)]
    return checks, slurm_facts(job, visible, node_gpus)
