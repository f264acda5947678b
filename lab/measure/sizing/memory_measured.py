"""`lab memory --measure`: ResNet-18 trained a few steps as one process, then as 2 ranks under DDP and under FSDP
(fully_shard), its parameter, gradient and optimizer-state bytes counted (lab.measure.sizing.memory sets them beside
its estimate)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `lab memory` estimates without torch
    from torch import nn

    from lab.run.cluster.dist import DistContext

WORKER = "lab.measure.sizing.memory_measured"  # this module: every rank of a job runs its worker()


def measure(width: int) -> dict[str, Any]:
    """ResNet-18 trained a few steps: one process, then 2 ranks with DDP and with FSDP (fully_shard)."""
    from lab.run.cluster import jobs, runner

    runner.check_processes(2, "lab memory --measure")  # its 2-rank job: refused before the first process starts
    try:  # one process alone (no process group), as the baseline trains
        result = {"single": jobs.run(jobs.Job(WORKER, 1, {"width": width}, launcher="none"))[0]}
    except jobs.JobFailed as exc:
        raise RuntimeError(f"lab memory --measure: the 1-process measurement failed: {exc}") from None
    try:
        result["two_ranks"] = jobs.run(jobs.Job(WORKER, 2, {"width": width}, reports=1))[0]
    except jobs.JobFailed as exc:
        result["two_ranks"] = {"error": f"the 2-rank DDP/FSDP measurement failed to run here ({exc})"}
    return result


def _train_and_count(model: nn.Module, ctx: DistContext, steps: int = 3) -> dict[str, Any]:
    import torch

    from lab.run.training.strategies.base import tensor_bytes  # a DTensor (an FSDP shard) counts this rank's part only

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    for _ in range(steps):
        x = torch.randn(8, 3, 32, 32, device=ctx.device)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (8,), device=ctx.device))
        loss.backward()
        optimizer.step()  # gradients kept (no zero_grad after the last step): they are part of the footprint
        if _ != steps - 1:
            optimizer.zero_grad()
    params = list(model.parameters())
    counts = {
        "parameters_bytes": tensor_bytes(params),
        "gradients_bytes": tensor_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer_states_bytes": tensor_bytes(
            [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        ),
    }
    counts["total_bytes"] = sum(counts.values())
    counts["measured_bytes"] = (
        torch.cuda.max_memory_allocated(ctx.device) if ctx.device.type == "cuda" else counts["total_bytes"]
    )
    return counts


def worker(argv: list[str]) -> None:
    import torch

    from lab.run.cluster import dist, jobs
    from lab.run.config import DistConfig, ModelConfig
    from lab.run.training import model

    job = jobs.this_job(argv)
    width = job.params["width"]
    with dist.initialized(DistConfig()) as ctx:
        torch.manual_seed(0)
        build = lambda: model.build(ModelConfig(width=width)).to(ctx.device)  # noqa: E731
        if not ctx.distributed:
            counts = _train_and_count(build(), ctx)
            counts.update(parameter_count=sum(p.numel() for p in build().parameters()), device=ctx.device.type)
            job.report(0, counts)
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        result: dict[str, Any] = {"ddp": _train_and_count(DDP(build()), ctx)}
        try:
            from lab.compat import fully_shard as fully_shard_of_this_torch

            fully_shard = fully_shard_of_this_torch()
            sharded = build()
            for stage in (sharded.layer1, sharded.layer2, sharded.layer3, sharded.layer4):
                fully_shard(stage)
            fully_shard(sharded)
            result["fsdp"] = _train_and_count(sharded, ctx)
        except Exception as exc:
            result["fsdp_error"] = f"FSDP cannot run here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        # Every rank holds its own shard; rank 0's figures stand for all (shards are equal up to padding).
        if ctx.is_primary:
            job.report(0, result)


if __name__ == "__main__":
    worker(sys.argv[1:])
