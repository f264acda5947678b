"""Slurm's and MPI's variables, as srun and mpirun set them, read by the real CLI in a subprocess.

No Slurm runs here: the variables are the ones a real srun step sets (recorded from tests/infra/test_slurm.py's
cluster), so the refusals and `lab launch --slurm --dry-run` are checked in a second each. The real cluster runs
the same code paths in tests/infra/test_slurm.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from lab.run.cluster import slurm
from tests.conftest import PYTHON, ROOT

# What srun -N2 --ntasks-per-node=1 sets on its second node (trimmed to what the lab reads)
STEP_ON_N2 = {
    "SLURM_JOB_ID": "41",
    "SLURM_CLUSTER_NAME": "dgx",
    "SLURM_JOB_NODELIST": "dgx[07-08]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "dgx08",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NTASKS": "2",
    "LAB_SLURM_NODE_ADDRESSES": "10.0.0.7 10.0.0.8",
}


def _lab(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "OMPI_", "PMI_", "LAB_SLURM"))}
    return subprocess.run(
        [PYTHON, "-m", "lab", *args], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_launch_under_slurm_takes_the_rendezvous_from_the_allocation():
    proc = _lab("launch", "--slurm", "--nproc-per-node", "8", "--dry-run", "--", "-m", "lab", "train", env=STEP_ON_N2)
    assert proc.returncode == 0, proc.stderr
    assert (
        "--nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint 10.0.0.7:29400 --rdzv-id slurm-dgx-41"
    ) in proc.stdout and "--local-addr 10.0.0.8" in proc.stdout
    assert "Slurm job 41, node 1 of 2 (dgx08, 10.0.0.8)" in proc.stderr


def test_under_slurm_the_first_node_serves_the_rendezvous_store_and_no_other_does():
    """torch's own guess makes every node the store's host where the endpoint is a loopback address (two "nodes"
    on one host, as tests/infra/test_slurm.py's): the second node's store then served the first, and its exit
    took the store away before it could say why it failed. The allocation says which node is first."""
    first = {**STEP_ON_N2, "SLURM_NODEID": "0", "SLURMD_NODENAME": "dgx07", "SLURM_PROCID": "0"}
    said = {}
    for node, env in (("first", first), ("second", STEP_ON_N2)):
        proc = _lab("launch", "--slurm", "--nproc-per-node", "8", "--dry-run", "--", "-m", "lab", "train", env=env)
        assert proc.returncode == 0, proc.stderr
        said[node] = proc.stdout
    assert "--rdzv-conf is_host=1 " in said["first"] and "--rdzv-conf is_host=0 " in said["second"], said


@pytest.mark.parametrize(
    "env, args, says",
    [
        ({}, [], "--slurm: no Slurm job here (SLURM_JOB_ID is unset)"),
        ({k: v for k, v in STEP_ON_N2.items() if not k.startswith("SLURM_STEP")}, [], "batch script, not a step"),
        (
            {**STEP_ON_N2, "SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)"},
            [],
            "runs 16 task(s) on 2 node(s)",
        ),
        (STEP_ON_N2, ["--nnodes", "2"], "--slurm takes --nnodes from the allocation"),
        ({**STEP_ON_N2, "LAB_SLURM_NODE_ADDRESSES": "10.0.0.7"}, [], "1 address(es) for the job's 2 nodes"),
    ],
)
def test_launch_under_slurm_refuses_what_would_not_meet_in_one_line(env, args, says):
    proc = _lab("launch", "--slurm", *args, "--dry-run", "--", "-m", "lab", "train", env=env)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "env, says",
    [
        (STEP_ON_N2, "task 1 of 2 of a Slurm step (srun -n 2) without torchrun"),
        ({"OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_RANK": "3"}, "rank 3 of 16 of an MPI job (mpirun -np 16)"),
        ({"PMI_SIZE": "4", "PMI_RANK": "0"}, "rank 0 of 4 of an MPI or PMI job"),
    ],
)
def test_train_started_as_one_rank_of_many_without_torchrun_is_refused(env, says, tmp_path):
    proc = _lab("train", "--config", "smoke", "--set", f"run.output_dir={tmp_path}", env=env)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "lab launch" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing trained, nothing written


def test_a_standalone_launch_inside_a_step_of_several_tasks_is_refused():
    proc = _lab("launch", "--nproc-per-node", "2", "--dry-run", "--", "-m", "lab", "train", env=STEP_ON_N2)
    assert proc.returncode == 2 and "task 1 of 2 of a Slurm step" in proc.stderr, proc.stderr


def test_one_task_per_node_and_the_batch_script_are_not_refused():
    torchrun = {"LOCAL_RANK": "0", "WORLD_SIZE": "16", "TORCHELASTIC_RUN_ID": "job"}
    assert slurm.foreign_launch({**STEP_ON_N2, **torchrun}) is None  # torchrun's worker
    # enroot's PyTorch hook (pyxis, an NGC image) exports RANK, LOCAL_RANK and WORLD_SIZE from SLURM_* into every
    # task: without torchrun's agent they prove nothing, and one task per rank is still refused
    hook = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "n1"}
    assert "without torchrun" in slurm.foreign_launch({**STEP_ON_N2, **hook})
    assert slurm.foreign_launch({k: v for k, v in STEP_ON_N2.items() if not k.startswith("SLURM_STEP")}) is None
    assert slurm.foreign_launch({**STEP_ON_N2, "SLURM_STEP_NUM_TASKS": "1"}) is None  # srun -n1


def test_the_allocation_is_read_as_srun_sets_it():
    job = slurm.allocation(STEP_ON_N2)
    assert job.nodes == ["dgx07", "dgx08"] and job.node_id == 1 and job.in_step and job.step_tasks_per_node == [1, 1]
    assert slurm.placement(29400, STEP_ON_N2) == slurm.Placement(2, "10.0.0.7:29400", "10.0.0.8", "slurm-dgx-41")
    assert slurm.record(STEP_ON_N2) == {
        "job_id": "41",
        "cluster": "dgx",
        "nodes": ["dgx07", "dgx08"],
        "restart_count": 0,
    }


def test_enroots_hook_variables_alone_are_one_process_not_a_rank(monkeypatch):
    """RANK/LOCAL_RANK/WORLD_SIZE from enroot's PyTorch hook, without torchrun's agent: one process alone, which
    prints its own refusals (the second node's `lab launch --slurm` took itself for rank 1 and kept them quiet)."""
    from lab.run.cluster import torchrun_env

    for name in ("TORCHELASTIC_RUN_ID", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n1"}.items():
        monkeypatch.setenv(name, value)
    assert torchrun_env.layout() == torchrun_env.Layout(0, 0, 1, 1, 0) and torchrun_env.is_primary_process()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")  # the same variables under torchrun's agent: rank 1 of 2
    assert torchrun_env.layout().global_rank == 1 and torchrun_env.layout().world_size == 2
