"""batchnorm: BatchNorm's running statistics under DDP, when each rank's shard looks different.

Every rank trains the same tiny BatchNorm MLP under DDP on its own shard, and the shards differ: the data
are split by class (rank r holds the classes c with c % N == r % N), as happens when a data set is sorted
or stored one class per file. DDP averages the gradients, so the weights stay identical; the running mean
and variance are buffers, which DDP does not average. Measured after training: the largest difference
between ranks of each buffer, and the loss and accuracy each rank's model reports on one shared test set.

Broken: broadcast_buffers=False. Fixes: broadcast_buffers=True (DDP's default: rank 0's buffers are copied
to every rank at each forward, evaluation included), GroupNorm (no running statistics at all), and
SyncBatchNorm (statistics over every rank's batch; PyTorch implements it for CUDA only).

>>> shard_classes(rank=1, world_size=2)
[1, 3]
>>> [shard_classes(r, 8) for r in (0, 4, 7)]      # more ranks than classes: one class each
[[0], [0], [3]]
>>> spread([[0.0, 1.0], [0.5, 1.0], [0.25, 1.0]])  # the largest between-rank difference of any element
0.5
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from lab.course.pitfalls import module_name, workers
from lab.run.cluster import jobs

if TYPE_CHECKING:
    from lab.run.cluster.dist import DistContext

PITFALL = "batchnorm"
STEPS = 30
BATCH_PER_RANK = 32
TRAIN_PER_RANK = 512
TEST_SAMPLES = 1024
LEARNING_RATE = 0.05
SYNC_BN_SKIPPED = "SyncBatchNorm needs CUDA in PyTorch; skipped"
# Every rank updates its running statistics from the same all-gathered batch statistics, so they should agree
# exactly; the tolerance leaves room for a GPU reduction order that differs between devices (not seen, not tested here).
SYNC_BN_TOLERANCE = 1e-6
# (side, norm layer, broadcast_buffers, SyncBatchNorm)
VARIANTS = [
    ("broken", "batch", False, False),
    ("broadcast_buffers", "batch", True, False),
    ("groupnorm", "group", False, False),
    ("syncbatchnorm", "batch", False, True),
]
COLUMNS = {
    "broken": "broken: BatchNorm, broadcast_buffers=False",
    "broadcast_buffers": "fixed: broadcast_buffers=True",
    "groupnorm": "fixed: GroupNorm",
    "syncbatchnorm": "fixed: SyncBatchNorm",
}

WHY = (
    "BatchNorm's running mean and variance are buffers, not parameters: DDP averages gradients, never buffers. "
    "With broadcast_buffers=False each rank keeps the statistics of its own shard, so the same weights evaluate "
    "differently on each rank, and a checkpoint from rank 0 carries rank 0's statistics only. "
    "broadcast_buffers=True (DDP's default) copies rank 0's buffers to every rank at each forward: identical, "
    "but still rank 0's shard; SyncBatchNorm computes the batch statistics over all ranks (CUDA); GroupNorm "
    "has no running statistics to disagree on."
)


def shard_classes(rank: int, world_size: int) -> list[int]:
    from lab.course.pitfalls.toy import CLASSES

    groups = min(world_size, CLASSES)
    return [c for c in range(CLASSES) if c % groups == rank % groups]


def spread(values_per_rank: list[list[float]]) -> float:
    """max over elements of (largest - smallest value across ranks); 0.0 when the ranks agree exactly."""
    return max((max(column) - min(column) for column in zip(*values_per_rank)), default=0.0)


def measure(world_size: int) -> dict[str, Any]:
    device = workers.choose_device(world_size)
    rank0 = workers.run_job(module_name(PITFALL), world_size, device, reports_expected=1)[0]
    sides = {side: summarize(rank0["variants"][side]) for side, *_ in VARIANTS}
    broken = sides["broken"]
    fixes = {side: sides[side] for side in ("broadcast_buffers", "groupnorm", "syncbatchnorm")}
    shown = broken["running_mean_spread"] > 1e-3 and broken["test_loss_spread"] > 0
    bb = fixes["broadcast_buffers"]
    sync_bn = fixes["syncbatchnorm"]
    fixed_ok = (
        bb["running_mean_spread"] == 0
        and bb["test_loss_spread"] == 0
        and fixes["groupnorm"]["test_loss_spread"] == 0
        and (sync_bn.get("skipped") or sync_bn["running_mean_spread"] <= SYNC_BN_TOLERANCE)
    )
    demonstrated = shown and fixed_ok

    def cell(side: dict[str, Any], key: str, fmt: str) -> str:
        if side.get("skipped"):
            return "skipped (CUDA only)"
        return "none (no running statistics)" if side[key] is None else format(side[key], fmt)

    def per_rank(side: dict[str, Any], key: str, fmt: str) -> str:
        return "skipped (CUDA only)" if side.get("skipped") else " / ".join(format(v, fmt) for v in side[key])

    order = [broken, *fixes.values()]
    table = {
        "columns": [COLUMNS[side] for side, *_ in VARIANTS],
        "rows": [
            ["running_mean: max difference between ranks", *(cell(s, "running_mean_spread", ".4f") for s in order)],
            ["running_var: max difference between ranks", *(cell(s, "running_var_spread", ".4f") for s in order)],
            [
                "test loss per rank (same weights, same test set)",
                *(per_rank(s, "test_loss_per_rank", ".4f") for s in order),
            ],
            ["test accuracy per rank", *(per_rank(s, "test_accuracy_per_rank", ".1%") for s in order)],
            ["weights: max difference between ranks", *(cell(s, "weight_spread", ".1g") for s in order)],
        ],
    }
    notes = [SYNC_BN_SKIPPED] if fixes["syncbatchnorm"].get("skipped") else []
    accuracy_note = "" if broken["test_accuracy_spread"] > 0 else "; the accuracies happen to agree, the losses do not"
    summary = (
        f"broadcast_buffers=False: running means differ by up to {broken['running_mean_spread']:.3f} between "
        f"ranks and the test loss by {broken['test_loss_spread']:.4f} (accuracy by "
        f"{broken['test_accuracy_spread']:.1%}{accuracy_note}); broadcast_buffers=True: "
        f"{bb['running_mean_spread']:g} and {bb['test_loss_spread']:g}; "
        f"GroupNorm: test loss differs by {fixes['groupnorm']['test_loss_spread']:g}"
    )
    if not demonstrated:
        summary = "expected a spread > 0 without broadcast and exactly 0 with each fix; measured " + summary
    return {
        "pitfall": PITFALL,
        "world_size": world_size,
        "device": rank0["device"],
        "broken": broken,
        "fixed": fixes,
        "demonstrated": demonstrated,
        "summary": summary,
        "why": WHY,
        "table": table,
        "notes": notes,
    }


def summarize(per_rank: list[dict[str, Any]] | dict[str, Any]) -> dict[str, Any]:
    """One variant's spreads from every rank's buffers, weights and test figures."""
    if isinstance(per_rank, dict):  # {"skipped": true, "reason": ...}
        return per_rank
    buffers = per_rank[0]["buffers"].keys()
    found = {name: spread([r["buffers"][name] for r in per_rank]) for name in buffers}

    def buffer_spread(kind: str) -> float | None:
        return max((v for name, v in found.items() if name.endswith(kind)), default=None)

    losses = [r["test_loss"] for r in per_rank]
    accuracies = [r["test_accuracy"] for r in per_rank]
    return {
        "running_mean_spread": buffer_spread("running_mean"),
        "running_var_spread": buffer_spread("running_var"),
        "weight_spread": spread([r["weights"] for r in per_rank]),
        "test_loss_per_rank": losses,
        "test_loss_spread": max(losses) - min(losses),
        "test_accuracy_per_rank": accuracies,
        "test_accuracy_spread": max(accuracies) - min(accuracies),
        "shard_classes_per_rank": [r["classes"] for r in per_rank],
    }


# ----------------------------------------------------------------------------- the torchrun worker


def worker(argv: list[str]) -> None:
    from lab.run.cluster import dist

    job = jobs.this_job(argv)
    with workers.process_group(job.params["device"]) as ctx:
        variants: dict[str, dict[str, Any] | list[Any]] = {}  # a skipped variant's reason, or every rank's result
        for side, norm, broadcast_buffers, sync in VARIANTS:
            if sync and ctx.device.type != "cuda":
                variants[side] = {"skipped": True, "reason": SYNC_BN_SKIPPED}
                continue
            variants[side] = dist.all_gather_object(ctx, train_and_evaluate(ctx, norm, broadcast_buffers, sync))
        if ctx.is_primary:
            job.report(ctx.global_rank, {"device": workers.device_name(ctx), "variants": variants})


def train_and_evaluate(ctx: DistContext, norm: str, broadcast_buffers: bool, sync: bool) -> dict[str, Any]:
    """STEPS of DDP on this rank's classes, then the shared test set through the DDP wrapper in eval mode
    (so broadcast_buffers=True syncs the buffers first, as DDP does for any forward)."""
    import torch
    from torch.nn.functional import cross_entropy
    from torch.nn.parallel import DistributedDataParallel

    from lab.course.pitfalls import toy

    model = toy.mlp(norm, seed=0)
    if sync:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=ctx.device_ids, broadcast_buffers=broadcast_buffers)
    classes = shard_classes(ctx.global_rank, ctx.world_size)
    x, y = (t.to(ctx.device) for t in toy.blobs(TRAIN_PER_RANK, seed=10 + ctx.global_rank, classes=classes))
    test_x, test_y = (t.to(ctx.device) for t in toy.blobs(TEST_SAMPLES, seed=2))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
    batches = torch.randint(len(x), (STEPS, BATCH_PER_RANK), generator=torch.Generator().manual_seed(ctx.global_rank))
    ddp.train()
    for batch in batches.to(ctx.device):
        optimizer.zero_grad(set_to_none=True)
        cross_entropy(ddp(x[batch]), y[batch]).backward()
        optimizer.step()
    ddp.eval()
    with torch.no_grad():
        logits = ddp(test_x)
        loss = cross_entropy(logits, test_y).item()
        accuracy = (logits.argmax(1) == test_y).float().mean().item()
    return {
        "classes": classes,
        "test_loss": loss,
        "test_accuracy": accuracy,
        "buffers": {name: b.flatten().tolist() for name, b in model.named_buffers() if "running" in name},
        "weights": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
    }


if __name__ == "__main__":
    worker(sys.argv[1:])
