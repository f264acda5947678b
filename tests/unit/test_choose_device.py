"""Which device a rank takes: every GPU of the node visible (cuda:LOCAL_RANK), or one GPU of its own per
process (Slurm's --gpus-per-task, Kubernetes, Docker: cuda:0), and a refusal that shows the numbers otherwise.

There is no GPU here: torch.cuda.is_available and device_count are faked, and choose_device only builds a
torch.device (it touches no GPU), so the test asserts what a GPU host would get."""

from __future__ import annotations

import pytest
import torch

from lab.errors import LaunchError
from lab.run.cluster import dist


@pytest.fixture
def gpus(monkeypatch):
    """gpus(n, visible=...): this process sees n CUDA devices, with CUDA_VISIBLE_DEVICES set to `visible`."""

    def fake(count: int, visible: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    return fake


@pytest.mark.parametrize("local_rank", [0, 1, 2, 3])
def test_one_visible_device_per_process_is_that_device(gpus, local_rank):
    gpus(1, visible=str(4 + local_rank))  # Slurm --gpus-per-task=1: task r sees only its own GPU, as device 0
    assert dist.choose_device("auto", local_rank, 4) == torch.device("cuda", 0)
    assert dist.choose_device("cuda", local_rank, 4) == torch.device("cuda", 0)


@pytest.mark.parametrize("visible", [4, 8])
def test_every_gpu_visible_gives_each_local_rank_its_own(gpus, visible):
    gpus(visible)
    assert [dist.choose_device("auto", r, 4) for r in range(4)] == [torch.device("cuda", r) for r in range(4)]


def test_one_process_on_a_one_gpu_host(gpus):
    gpus(1)
    assert dist.choose_device("auto", 0, 1) == torch.device("cuda", 0)
    assert dist.choose_device("auto", 0) == torch.device("cuda", 0)  # the benchmarks' call, without a layout


@pytest.mark.parametrize("count, visible, local_rank", [(1, None, 1), (2, "0,1", 3), (2, None, 0)])
def test_too_few_devices_are_refused_with_the_numbers_and_both_remedies(gpus, count, visible, local_rank):
    gpus(count, visible=visible)
    with pytest.raises(LaunchError) as info:
        dist.choose_device("auto", local_rank, 4 if count == 2 else 2)
    message = str(info.value)
    local_world_size = 4 if count == 2 else 2
    assert message.startswith(
        f"dist.device: local rank {local_rank} of {local_world_size} processes on this node "
        f"has no GPU of its own: {count} visible (CUDA_VISIBLE_DEVICES={visible or 'unset'})"
    )
    assert f"start at most {count} processes per node" in message
    assert "give each process one device of its own" in message and "--gpus-per-task=1" in message
    assert "\n" not in message


def test_a_caller_that_gives_only_the_local_rank_gets_no_device_that_is_not_there(gpus):
    gpus(2)
    assert dist.choose_device("auto", 1) == torch.device("cuda", 1)
    with pytest.raises(LaunchError, match="local rank 2 of 3 processes on this node has no GPU of its own"):
        dist.choose_device("auto", 2)


def test_one_gpu_shared_by_two_local_ranks_is_refused(gpus):
    """Two ranks on a 1-GPU host without CUDA_VISIBLE_DEVICES both see the same GPU: NCCL cannot use it twice."""
    gpus(1)
    with pytest.raises(LaunchError, match="local rank 0 of 2 processes"):
        dist.choose_device("auto", 0, 2)


def test_cpu_needs_no_gpu(gpus):
    gpus(0)
    assert dist.choose_device("auto", 3, 4) == torch.device("cpu")
    assert dist.choose_device("cpu", 3, 4) == torch.device("cpu")
    with pytest.raises(LaunchError, match="no CUDA device is visible"):
        dist.choose_device("cuda", 0, 1)


def test_two_local_ranks_on_one_gpu_are_refused_naming_them_before_nccl_starts(gpus):
    """torchrun --nproc-per-node 2 on a one-GPU seat (CUDA_VISIBLE_DEVICES=3 for both workers): each sees one GPU,
    takes cuda:0, and both are the same GPU. Two ranks meet in one store (threads here, processes there): both are
    refused, in one line; ranks on GPUs of their own pass."""
    import threading

    from torch import distributed as tdist

    gpus(1, visible="3")
    assert [dist.choose_device("auto", r, 2) for r in (0, 1)] == [torch.device("cuda", 0)] * 2  # each alone: fine

    def meet(uuids: list[str]) -> list[BaseException | None]:
        store = tdist.HashStore()
        outcome: list[BaseException | None] = [None] * len(uuids)

        def rank(r: int) -> None:
            try:
                dist.refuse_shared_gpu(store, 0, r, len(uuids), uuids[r])
            except LaunchError as exc:
                outcome[r] = exc

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(uuids))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        return outcome

    refused = meet(["GPU-aaaa", "GPU-aaaa"])
    assert all(isinstance(e, LaunchError) for e in refused), refused
    assert str(refused[0]).startswith("dist.device: local ranks 0, 1 of node 0 are all on GPU GPU-aaaa")
    assert "CUDA_VISIBLE_DEVICES=3" in str(refused[0]) and "at most 1 process(es) per node" in str(refused[0])
    assert meet(["GPU-aaaa", "GPU-bbbb"]) == [None, None]  # one GPU each (Slurm's --gpus-per-task): no refusal


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_GPUS": "0,1"}, "Slurm gave this step GPU(s) 0,1 (SLURM_STEP_GPUS)"),
        ({"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "8"}, "Slurm gave this job 8 GPU(s) (SLURM_GPUS_ON_NODE)"),
        (  # --exclusive without a GPU request: the job holds the GPUs, its steps get none (Slurm 22.05, measured)
            {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_JOB_GPUS": "0,1"},
            "this job holds GPU(s) 0,1 on this node (SLURM_JOB_GPUS; --exclusive gives a job its nodes' GPUs) but "
            "Slurm gave its step none: submit with --gpus-per-node",
        ),
        (
            {"SLURM_JOB_ID": "7", "SLURM_NODEID": "1", "LAB_SLURM_NODE_GPUS": "2 2"},
            "Slurm's node 1 of this job has 2 GPU(s) (its Gres) but the job asked for none: submit with "
            "--gpus-per-node=2",
        ),
    ],
)
def test_a_step_that_was_meant_to_have_gpus_never_falls_back_to_the_cpu(gpus, monkeypatch, env, said):
    """Slurm gave GPUs (or the node has them and the job asked for none) but torch sees none: dist.device=auto
    refuses in one line; dist.device=cpu trains on the CPU on purpose."""
    gpus(0)
    for name in (
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "SLURM_STEPID",
        "SLURM_STEP_GPUS",
        "SLURM_JOB_GPUS",
        "SLURM_GPUS_ON_NODE",
        "SLURM_NODEID",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(LaunchError) as refused:
        dist.choose_device("auto", 0, 1)
    assert str(refused.value).startswith(f"dist.device=auto: {said}, but torch ") and "\n" not in str(refused.value)
    assert "does not train on the CPU" in str(refused.value) and "dist.device=cpu" in str(refused.value)
    assert dist.choose_device("cpu", 0, 1) == torch.device("cpu")


def test_the_drivers_gpus_count_unless_they_are_hidden_on_purpose(tmp_path, monkeypatch):
    """/proc/driver/nvidia/gpus lists the GPUs the driver bound, even where the device files are hidden (a cgroup,
    a container without --gpus); an empty CUDA_VISIBLE_DEVICES hides them on purpose (a CPU seat of a room)."""
    from lab.run.cluster import expected_gpus

    driver = tmp_path / "gpus"
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (driver / bus).mkdir(parents=True)
    assert expected_gpus.unseen({}, driver=driver) == f"this node's NVIDIA driver has 2 GPU(s) ({driver})"
    assert expected_gpus.unseen({"CUDA_VISIBLE_DEVICES": ""}, driver=driver) is None
    assert expected_gpus.unseen({}, driver=tmp_path / "none") is None  # no driver: a CPU machine
