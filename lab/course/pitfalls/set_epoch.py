"""set-epoch: a DistributedSampler whose set_epoch is never called shuffles every epoch the same way.

DistributedSampler seeds its permutation with seed + epoch, and its epoch is whatever set_epoch last
set: 0 when it is never called. Measured by iterating real samplers in the torchrun workers (rank 0
gathers every rank's order per epoch), without and with `sampler.set_epoch(epoch)`, then by a short
DDP training run with each, whose test loss per epoch is printed beside the other.

>>> repeat_share([[3, 1, 2], [3, 1, 2], [3, 1, 2]])        # epochs 1 and 2 both repeat epoch 0
1.0
>>> repeat_share([[3, 1, 2], [1, 2, 3], [3, 1, 2]])        # epoch 2 does, epoch 1 does not
0.5
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from lab.course.pitfalls import module_name, workers
from lab.run.cluster import jobs

if TYPE_CHECKING:
    from lab.run.cluster.dist import DistContext

PITFALL = "set-epoch"
EPOCHS = 5
SAMPLES = 512  # the training set; the sampler orders its indices
TEST_SAMPLES = 1024
BATCH_PER_RANK = 16
LEARNING_RATE = 0.05
SMALL_LOSS_GAP = 0.05  # relative: below this, the training effect is called small, as it is on this toy

WHY = (
    "DistributedSampler shuffles with a generator seeded by seed + epoch, and the epoch is whatever "
    "set_epoch last set: without set_epoch every epoch is epoch 0, so each rank sees the same samples in the "
    "same order every epoch and the shuffle is lost. Call sampler.set_epoch(epoch) at the top of every epoch, "
    "on every rank with the same epoch, so the ranks' shards still split one permutation between them."
)


def repeat_share(orders: list[list[int]]) -> float:
    """The share of the epochs after the first whose order is epoch 0's."""
    later = orders[1:]
    return sum(order == orders[0] for order in later) / len(later)


def measure(world_size: int) -> dict[str, Any]:
    device = workers.choose_device(world_size)
    rank0 = workers.run_job(module_name(PITFALL), world_size, device, {"epochs": EPOCHS}, reports_expected=1)[0]
    sides = {side: summarize(rank0["orders"][side], rank0["training"][side]) for side in ("broken", "fixed")}
    broken, fixed = sides["broken"], sides["fixed"]
    demonstrated = broken["repeat_share"] == 1.0 and fixed["repeat_share"] == 0.0
    loss_gap = (broken["final_test_loss"] - fixed["final_test_loss"]) / fixed["final_test_loss"]
    effect = (
        f"final test loss {broken['final_test_loss']:.4f} without vs {fixed['final_test_loss']:.4f} with "
        f"({loss_gap:+.1%})"
    )
    notes = [
        f"training effect: {effect}"
        + (
            ": small on this toy; the repeated order is the bug, the loss is not how it shows here"
            if abs(loss_gap) < SMALL_LOSS_GAP
            else ""
        )
    ]
    later = EPOCHS - 1
    summary = (
        f"without set_epoch {broken['repeat_share']:.0%} of the {later} later epochs repeated epoch 0's order "
        f"on every rank; with it {fixed['repeat_share']:.0%}"
    )
    if not demonstrated:
        summary = f"expected 100% vs 0%, measured {broken['repeat_share']:.0%} vs {fixed['repeat_share']:.0%}"

    def curve(side: dict[str, Any]) -> str:
        return " ".join(f"{loss:.3f}" for loss in side["test_loss_by_epoch"])

    table = {
        "columns": ["broken: no set_epoch", "fixed: set_epoch(epoch)"],
        "rows": [
            [
                "later epochs repeating epoch 0's order",
                *(f"{s['repeat_share']:.0%} ({s['repeats']}/{s['compared']})" for s in (broken, fixed)),
            ],
            [
                f"distinct orders in {EPOCHS} epochs, per rank",
                *(" / ".join(map(str, s["distinct_orders_per_rank"])) for s in (broken, fixed)),
            ],
            [
                f"distinct samples rank 0 saw in {EPOCHS} epochs",
                *(f"{s['rank0_distinct_samples']} of {SAMPLES}" for s in (broken, fixed)),
            ],
            [
                "samples per epoch, all ranks (distinct)",
                *(f"{s['samples_per_epoch']} ({s['distinct_per_epoch']})" for s in (broken, fixed)),
            ],
            ["test loss by epoch (DDP training)", curve(broken), curve(fixed)],
        ],
    }
    return {
        "pitfall": PITFALL,
        "world_size": world_size,
        "device": rank0["device"],
        "broken": broken,
        "fixed": fixed,
        "demonstrated": demonstrated,
        "summary": summary,
        "why": WHY,
        "table": table,
        "notes": notes,
        "effect_on_training": {"relative_final_loss_gap": loss_gap, "small": abs(loss_gap) < SMALL_LOSS_GAP},
    }


def summarize(orders_per_rank: list[list[list[int]]], training: dict[str, Any]) -> dict[str, Any]:
    """One side's numbers from every rank's per-epoch orders and rank 0's training curve."""
    shares = [repeat_share(orders) for orders in orders_per_rank]
    compared = sum(len(orders) - 1 for orders in orders_per_rank)
    repeats = round(sum(share * (len(orders) - 1) for share, orders in zip(shares, orders_per_rank)))
    first_epoch = [i for orders in orders_per_rank for i in orders[0]]
    return {
        "repeat_share": repeats / compared,
        "repeats": repeats,
        "compared": compared,
        "repeat_share_per_rank": shares,
        "distinct_orders_per_rank": [len({tuple(o) for o in orders}) for orders in orders_per_rank],
        "rank0_distinct_samples": len({i for order in orders_per_rank[0] for i in order}),
        "samples_per_epoch": len(first_epoch),
        "distinct_per_epoch": len(set(first_epoch)),
        "epoch0_order_rank0_head": orders_per_rank[0][0][:8],
        **training,
    }


# ----------------------------------------------------------------------------- the torchrun worker


def worker(argv: list[str]) -> None:
    from torch.utils.data import Dataset, DistributedSampler

    from lab.run.cluster import dist

    job = jobs.this_job(argv)
    epochs = job.params["epochs"]
    with workers.process_group(job.params["device"]) as ctx:
        orders, training = {}, {}
        for side, calls_set_epoch in (("broken", False), ("fixed", True)):
            sampler: DistributedSampler[int] = DistributedSampler(
                cast(Dataset[int], range(SAMPLES)),  # the sampler reads only len(): the indices stand for the data
                num_replicas=ctx.world_size,
                rank=ctx.global_rank,
                shuffle=True,
                seed=0,
            )
            mine = []
            for epoch in range(epochs):
                if calls_set_epoch:
                    sampler.set_epoch(epoch)
                mine.append(list(sampler))  # the order this rank's DataLoader would see this epoch
            orders[side] = dist.all_gather_object(ctx, mine)
            training[side] = train(ctx, epochs, calls_set_epoch)
        if ctx.is_primary:
            job.report(ctx.global_rank, {"device": workers.device_name(ctx), "orders": orders, "training": training})


def train(ctx: DistContext, epochs: int, calls_set_epoch: bool) -> dict[str, Any]:
    """A few epochs of DDP on the toy blobs, the sampler's set_epoch called or not; the test loss after each."""
    import torch
    from torch.nn.functional import cross_entropy
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import Dataset, DistributedSampler

    from lab.course.pitfalls import toy

    x, y = (t.to(ctx.device) for t in toy.blobs(SAMPLES, seed=1))
    test_x, test_y = (t.to(ctx.device) for t in toy.blobs(TEST_SAMPLES, seed=2))
    model = toy.mlp("none", seed=0).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=ctx.device_ids)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE)
    sampler: DistributedSampler[int] = DistributedSampler(
        cast(Dataset[int], range(SAMPLES)), num_replicas=ctx.world_size, rank=ctx.global_rank, shuffle=True, seed=0
    )
    test_losses = []
    for epoch in range(epochs):
        if calls_set_epoch:
            sampler.set_epoch(epoch)
        for batch in torch.tensor(list(sampler), device=ctx.device).split(BATCH_PER_RANK):
            optimizer.zero_grad(set_to_none=True)
            cross_entropy(ddp(x[batch]), y[batch]).backward()
            optimizer.step()
        with torch.no_grad():  # every rank holds the same weights after a DDP step: rank 0's figure is everyone's
            test_losses.append(cross_entropy(model(test_x), test_y).item())
    return {"test_loss_by_epoch": test_losses, "final_test_loss": test_losses[-1]}


if __name__ == "__main__":
    worker(sys.argv[1:])
