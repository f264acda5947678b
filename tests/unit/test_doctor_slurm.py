"""`lab doctor` inside a Slurm job: the `slurm` line, the `gpu-share` rule, the JSON's "slurm" key.

No GPU and no Slurm exist on the machines these tests run on, so the GPU facts are faked: the rule is a pure
function of (the allocation read from an env dict, CUDA_VISIBLE_DEVICES, the node's GPU count), and the tests
hand it the environment srun would set on an 8-GPU node. The last test runs the real `lab doctor --json -` with
srun's variables set; there the GPU facts are this machine's (none here), so it checks the allocation, not GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lab.machine.health import doctor, doctor_slurm
from lab.run.cluster import slurm
from lab.verdict import Check
from tests.conftest import ROOT

EIGHT = ",".join(map(str, range(8)))


def step_env(tasks_per_node: int, nodes: int = 2, **extra: str) -> dict[str, str]:
    """What srun sets in one task of `srun -N NODES --ntasks-per-node TASKS_PER_NODE` (task 3 on the first node)."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_CLUSTER_NAME": "dgx",
        "SLURM_JOB_NODELIST": f"dgx[01-{nodes:02d}]",
        "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "dgx01",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(tasks_per_node * nodes),
        "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})",
        "SLURM_PROCID": str(min(3, tasks_per_node - 1)),
        "SLURM_LOCALID": str(min(3, tasks_per_node - 1)),
        **extra,
    }


def checks_for(env: dict[str, str], node_gpus: int | None = 8) -> dict[str, Check]:
    checks, _ = doctor_slurm.check_slurm_job(slurm.allocation(env), env.get("CUDA_VISIBLE_DEVICES"), node_gpus)
    return {c.name: c for c in checks}


def test_eight_tasks_that_each_see_all_eight_gpus_fail_with_the_counts_and_the_fix():
    # srun --ntasks-per-node=8 --gres=gpu:8: Slurm gives every task of the step the node's eight GPUs
    share = checks_for(step_env(8, SLURM_GPUS_ON_NODE="8", SLURM_STEP_GPUS=EIGHT, CUDA_VISIBLE_DEVICES=EIGHT))
    assert share["gpu-share"].verdict == "failed"
    assert share["gpu-share"].line() == (
        f"failed  gpu-share  8 tasks of this step on dgx01 each see 8 GPU(s) (CUDA_VISIBLE_DEVICES={EIGHT}) out of 8: "
        f"8 x 8 > 8, so some GPU is seen by more than one task; give each task its own GPU with "
        f"`srun --gpus-per-task=1`, or run one task per node that gives each rank its own GPU: "
        f"`srun --ntasks-per-node=1 lab launch --slurm ...`"
    )


def test_an_unset_cuda_visible_devices_means_the_whole_node_and_fails_the_same():
    share = checks_for(step_env(8))  # no GRES: nothing hides a GPU, each task sees the doctor's 8
    assert (
        share["gpu-share"].verdict == "failed"
        and "(CUDA_VISIBLE_DEVICES unset: the whole node) out of 8" in share["gpu-share"].detail
    )


def test_one_gpu_per_task_passes_and_names_the_rule():
    # srun --ntasks-per-node=8 --gpus-per-task=1: this task was given GPU 3 alone
    share = checks_for(step_env(8, SLURM_GPUS_ON_NODE="8", SLURM_STEP_GPUS=EIGHT, CUDA_VISIBLE_DEVICES="3"))
    assert share["gpu-share"].verdict == "held"
    assert share["gpu-share"].detail == (
        "8 tasks on dgx01 each see 1 GPU(s) (CUDA_VISIBLE_DEVICES=3) out of 8: 8 x 1 <= 8, no GPU need be seen twice"
    )


def test_the_pool_is_the_jobs_gpus_on_the_node_not_the_hosts():
    # two tasks each seeing four GPUs of a job given four: some GPU is seen twice, however many the host has
    env = step_env(2, SLURM_GPUS_ON_NODE="4", CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert checks_for(env, node_gpus=8)["gpu-share"].verdict == "failed"
    # without SLURM_GPUS_ON_NODE the index list counts (a range included)
    env = step_env(2, SLURM_STEP_GPUS="0-3", CUDA_VISIBLE_DEVICES="0,1,2,3")
    assert "out of 4: 2 x 4 > 4" in checks_for(env, node_gpus=8)["gpu-share"].detail


@pytest.mark.parametrize(
    "env, node_gpus, why",
    [
        (step_env(1, SLURM_GPUS_ON_NODE="8", CUDA_VISIBLE_DEVICES=EIGHT), 8, "one task of the step on dgx01"),
        (step_env(8), 0, "this task sees no GPU (CUDA_VISIBLE_DEVICES unset: the whole node)"),
        (step_env(8, CUDA_VISIBLE_DEVICES=""), 8, "this task sees no GPU (CUDA_VISIBLE_DEVICES=)"),
        ({k: v for k, v in step_env(8).items() if not k.startswith("SLURM_STEP")}, 8, "this is the batch script"),
    ],
)
def test_where_the_rule_does_not_apply_the_line_is_ok_and_says_why(env, node_gpus, why):
    # one task per node (the lab's own way, `lab launch --slurm`): torchrun's ranks are not srun's tasks
    share = checks_for(env, node_gpus)["gpu-share"]
    assert share.verdict == "not applicable" and share.detail.startswith(f"does not apply: {why}")


def test_an_unknown_pool_is_a_warning_not_a_guess():
    share = checks_for(step_env(8, CUDA_VISIBLE_DEVICES="3"), node_gpus=None)["gpu-share"]
    assert share.verdict == "held" and "SLURM_GPUS_ON_NODE" in share.fix


def test_the_slurm_line_and_facts_describe_the_allocation():
    env = step_env(8, SLURM_GPUS_ON_NODE="8", SLURM_STEP_GPUS=EIGHT, CUDA_VISIBLE_DEVICES="3")
    checks, facts = doctor_slurm.check_slurm_job(slurm.allocation(env), "3", 8)
    assert checks[0].line() == (
        "held    slurm      job 4242 on dgx: 2 node(s) dgx01,dgx02; this is dgx01 (node 0), step task 3 of 16, "
        f"8 on this node; 8 GPU(s) on this node (SLURM_STEP_GPUS/SLURM_JOB_GPUS={EIGHT}); "
        "this task sees CUDA_VISIBLE_DEVICES=3 (1 GPU(s))"
    )
    assert facts["nodes"] == ["dgx01", "dgx02"] and facts["node_count"] == 2
    assert (facts["tasks_on_this_node"], facts["gpus_on_node"], facts["gpus_seen"]) == (8, 8, 1)
    assert facts["cuda_visible_devices"] == "3" and facts["job_gpus"] == EIGHT


def test_outside_slurm_there_is_no_slurm_line_and_no_facts():
    assert doctor_slurm.check_slurm_job(slurm.allocation({"CUDA_VISIBLE_DEVICES": EIGHT}), EIGHT, 8) == ([], None)


def test_the_real_command_under_srun_variables_prints_the_line_and_the_json_key(tmp_path):
    # srun -N2 --ntasks-per-node=1: the lab's own layout, so gpu-share does not apply whatever GPUs exist here
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_VISIBLE_DEVICES"))}
    env |= {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_NODEID": "1",
        "SLURMD_NODENAME": "n2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_CLUSTER_NAME": "lab",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "doctor", "--output-dir", str(tmp_path), "--json", "-"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(proc.stdout)
    lines = {  # each line: its verdict (one of lab.verdict's, "not applicable" two words), the check's name, ...
        line.removeprefix("not applicable").split()[0 if line.startswith("not applicable") else 1]: line
        for line in proc.stderr.splitlines()
        if not line.startswith("doctor:")
    }
    assert lines["slurm"].startswith(
        "held    slurm      job 4242 on lab: 2 node(s) n1,n2; this is n2 (node 1), "
        "step task 1 of 2, 1 on this node; no GPUs requested (no GPU indices "
        "from Slurm); this task sees "
    )
    assert lines["gpu-share"].startswith("not applicable gpu-share  does not apply: one task of the step on n2")
    assert report["slurm"]["nodes"] == ["n1", "n2"] and report["slurm"]["node_name"] == "n2"
    assert report["slurm"] == report["facts"]["slurm"]
    assert report["slurm"]["gpus_on_node"] is None and report["slurm"]["tasks_on_this_node"] == 1


def test_outside_slurm_the_json_key_is_null(tmp_path, monkeypatch, capsys):
    # the whole doctor.run in this process, torch's checks faked (their facts do not matter here, and importing
    # torch would cost seconds)
    for name in [k for k in os.environ if k.startswith("SLURM")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(doctor, "check_torch", lambda expect_gpus: ([], {"gpu_count": 8}))
    doctor.run([], str(tmp_path), None, 0.0, str(tmp_path / "doctor.json"))
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["slurm"] is None and report["facts"]["slurm"] is None
    assert not {"slurm", "gpu-share"} & {c["name"] for c in report["checks"]}
    assert " slurm " not in capsys.readouterr().out
