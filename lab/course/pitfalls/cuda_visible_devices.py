"""cuda-visible-devices: which GPU each process lands on, with and without CUDA_VISIBLE_DEVICES.

CUDA numbers the devices a process can see from 0. Without CUDA_VISIBLE_DEVICES every process sees
every GPU, and one that never calls torch.cuda.set_device(local_rank) works on cuda:0: all ranks on GPU
0. With CUDA_VISIBLE_DEVICES set to one device per process (here: by each worker, to its local rank's
entry, before CUDA starts), each sees one GPU, as cuda:0, and cuda:LOCAL_RANK is an invalid ordinal
for every local rank but 0. Measured per process: device_count(), the device names, the current device
and the UUID of the GPU behind it (the one name for a GPU that does not depend on what a process sees).

Needs a host with two or more GPUs; elsewhere it prints what it would show and reports itself skipped.

>>> visible_for(local_rank=1, inherited=None), visible_for(local_rank=1, inherited="4,5")
('1', '5')
"""

from __future__ import annotations

import os
import sys
from typing import Any

from lab.course.pitfalls import module_name, workers
from lab.run.cluster import cores, jobs

PITFALL = "cuda-visible-devices"
MODES = {"broken": "all", "fixed": "one"}  # side -> what each process is let see

WHY = (
    "CUDA numbers the devices a process can see from 0. Without CUDA_VISIBLE_DEVICES every process sees every "
    "GPU, and one that never calls torch.cuda.set_device(local_rank) runs on cuda:0: all ranks share GPU 0. "
    "With CUDA_VISIBLE_DEVICES set to one device per process each sees exactly one GPU, as cuda:0, and "
    "cuda:LOCAL_RANK is then an invalid device ordinal for every rank but 0. torchrun sets neither: call "
    "set_device(local_rank) when the processes see every GPU, use cuda:0 when the launcher gave each one."
)


def visible_for(local_rank: int, inherited: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES a worker gives itself: its local rank's entry of what it inherited (a host or
    a scheduler may already have narrowed the list, to indices or UUIDs), else its local rank."""
    return inherited.split(",")[local_rank] if inherited else str(local_rank)


def measure(world_size: int) -> dict[str, Any]:
    gpus = cores.gpu_count()
    if gpus < 2:
        return skipped(world_size, gpus)
    n = min(world_size, gpus)
    sides = {side: workers.run_job(module_name(PITFALL), n, "cuda", {"mode": mode}) for side, mode in MODES.items()}
    broken, fixed = (summarize(sides[side]) for side in ("broken", "fixed"))
    demonstrated = (
        all(c == n for c in broken["device_count_per_rank"])
        and broken["distinct_gpus"] == 1
        and all(c == 1 for c in fixed["device_count_per_rank"])
        and fixed["distinct_gpus"] == n
        and fixed["own_index_valid_per_rank"][1:] == [False] * (n - 1)
    )

    def per_rank(key: str) -> list[str]:
        return [" / ".join(str(v) for v in side[key]) for side in (broken, fixed)]

    table = {
        "columns": ["broken: every process sees every GPU", "fixed: CUDA_VISIBLE_DEVICES=<local rank's GPU>"],
        "rows": [
            ["torch.cuda.device_count() per rank", *per_rank("device_count_per_rank")],
            ["current device per rank (no set_device)", *per_rank("current_device_per_rank")],
            ["distinct physical GPUs in use (by UUID)", broken["distinct_gpus"], fixed["distinct_gpus"]],
            ["torch.device('cuda', LOCAL_RANK) valid, per rank", *per_rank("own_index_valid_per_rank")],
        ],
    }
    summary = (
        f"without CUDA_VISIBLE_DEVICES {n} processes saw {broken['device_count_per_rank'][0]} GPUs each and all "
        f"ran on {broken['distinct_gpus']} GPU; with it each saw {fixed['device_count_per_rank'][0]} and they "
        f"ran on {fixed['distinct_gpus']} distinct GPUs"
    )
    if not demonstrated:
        summary = "expected all ranks on one GPU vs one GPU each; measured " + summary
    return {
        "pitfall": PITFALL,
        "world_size": n,
        "device": f"cuda ({sides['broken'][0]['names'][0]})",
        "broken": broken,
        "fixed": fixed,
        "demonstrated": demonstrated,
        "summary": summary,
        "why": WHY,
        "table": table,
        "notes": [],
        "skipped": False,
    }


def skipped(world_size: int, gpus: int) -> dict[str, Any]:
    reason = (
        "no CUDA device on this host"
        if gpus == 0
        else "this host has 1 GPU: every process sees the same one, with or without CUDA_VISIBLE_DEVICES"
    )
    n = max(world_size, 2)
    table = {
        "columns": [f"would show, {n} GPUs: no CUDA_VISIBLE_DEVICES", "would show: one device per process"],
        "rows": [
            ["torch.cuda.device_count() per rank", " / ".join([str(n)] * n), " / ".join(["1"] * n)],
            ["current device per rank (no set_device)", "cuda:0, the same GPU for all", "cuda:0, a different GPU each"],
            ["torch.device('cuda', LOCAL_RANK)", "valid: rank r's own GPU", "invalid device ordinal for ranks 1.."],
        ],
    }
    return {
        "pitfall": PITFALL,
        "world_size": world_size,
        "device": "cpu",
        "skipped": True,
        "reason": reason,
        "broken": {"skipped": True, "reason": reason},
        "fixed": {"skipped": True, "reason": reason},
        "demonstrated": False,
        "summary": f"skipped, not measured: {reason}",
        "why": WHY,
        "table": table,
        "notes": [f"not measured: {reason}; the table is what a host with {n} GPUs would show"],
    }


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "device_count_per_rank": [r["device_count"] for r in reports],
        "current_device_per_rank": [f"cuda:{r['current_device']}" for r in reports],
        "gpu_uuid_per_rank": [r["uuid"] for r in reports],
        "distinct_gpus": len({r["uuid"] for r in reports}),
        "own_index_valid_per_rank": [r["own_index_valid"] for r in reports],
        "own_index_error": next((r["own_index_error"] for r in reports if r["own_index_error"]), None),
        "cuda_visible_devices_per_rank": [r["cuda_visible_devices"] for r in reports],
    }


# ----------------------------------------------------------------------------- the torchrun worker (GPU hosts)


def worker(argv: list[str]) -> None:
    from lab.run.cluster import torchrun_env

    job = jobs.this_job(argv)
    layout = torchrun_env.layout()
    if job.params["mode"] == "one":  # before the first CUDA call: CUDA reads the variable once, when it starts
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_for(layout.local_rank, os.environ.get("CUDA_VISIBLE_DEVICES"))
    import torch

    count = torch.cuda.device_count()
    current = torch.cuda.current_device()  # what torch.device("cuda") means in this process
    error = None
    try:
        torch.empty(1, device=torch.device("cuda", layout.local_rank))
    except (RuntimeError, AssertionError) as exc:
        error = str(exc).strip().splitlines()[0][:200]
    job.report(
        layout.global_rank,
        {
            "device_count": count,
            "current_device": current,
            "names": [torch.cuda.get_device_name(i) for i in range(count)],
            "uuid": str(torch.cuda.get_device_properties(current).uuid),
            "own_index_valid": error is None,
            "own_index_error": error,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        },
    )


if __name__ == "__main__":
    worker(sys.argv[1:])
