"""The torchrun worker of `lab bench levers`: every rank builds a Trainer per variant, times them in
interleaved blocks and counts their activations; rank 0 reports the measurements to the parent.

`lab bench levers` starts it as a job of N ranks (lab.run.cluster.jobs): the checked config and the timing
parameters (steps, warmup, rounds, accum_steps, equivalence_steps) come in the job's folder.

What is measured, and why so, is in lab.measure.bench.train.levers, which also holds the variants and their config
layers; this module imports torch, the parent does not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from lab.measure.bench.train.levers import EXACT, PLAIN, merged, variants

if TYPE_CHECKING:
    from lab.run.cluster.dist import DistContext
    from lab.run.config import Config
    from lab.run.data import Dataset
    from lab.run.training.trainer import Trainer


def saved_activation_bytes(forward: Callable[[], object], leave_out: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd keeps for backward while `forward` runs, `leave_out`'s
    storages (the parameters) excluded: the activations that accumulation and bf16 shrink.

    >>> import torch
    >>> layer = torch.nn.Linear(1000, 10)
    >>> x = torch.randn(64, 1000)
    >>> saved_activation_bytes(lambda: layer(x).relu(), layer.parameters())   # x and relu's output, 4 bytes each
    258560
    """
    excluded = {t.untyped_storage().data_ptr() for t in leave_out}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded and storage.data_ptr() != 0:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward()
    return sum(seen.values())


@dataclass
class Timed:
    """A trainer being timed: its blocks' seconds, peaks and last loss."""

    label: str
    trainer: Trainer
    accum: int
    communicate: bool
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = field(init=False)
    block_seconds: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    step_peak_bytes: int | None = None
    loss: float | None = None

    def __post_init__(self) -> None:
        self.batches = self.trainer.train_loader.forever()

    def steps_of(self, count: int) -> Callable[[], None]:
        def work() -> None:
            for _ in range(count):
                self.trainer.accumulated_step(self.batches, self.accum, self.communicate)

        return work


def _block(ctx: DistContext, entry: Timed, steps: int) -> None:
    """One timed block of `entry`, its peak memory on CUDA and its mean loss (every rank calls it in turn)."""
    from lab.measure.bench.train import harness

    cuda = ctx.device.type == "cuda"
    entry.trainer.meter.close(ctx, entry.trainer.step)  # the loss tally from here on is this block's
    if cuda:
        torch.cuda.synchronize(ctx.device)
        resident = torch.cuda.memory_allocated(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    entry.block_seconds.append(harness.timed(ctx, entry.steps_of(steps), barrier=True))
    if cuda:
        peak = torch.cuda.max_memory_allocated(ctx.device)
        entry.peak_bytes = max(entry.peak_bytes or 0, peak)
        entry.step_peak_bytes = max(entry.step_peak_bytes or 0, peak - resident)
    interval = entry.trainer.meter.close(ctx, entry.trainer.step)
    entry.loss = interval.loss if interval is not None else None


def _slowest_rank(ctx: DistContext, entry: Timed, steps: int) -> list[float]:
    """Seconds per step of each of `entry`'s blocks on the rank that was slowest in that block: every rank's
    clock counts, since the slowest sets the pace."""
    from lab.run.cluster import dist

    return [max(ranks) / steps for ranks in zip(*dist.all_gather_object(ctx, entry.block_seconds))]


def _activations(trainer: Trainer) -> int:
    """Saved-for-backward bytes of one forward of one of `trainer`'s micro-batches, under its autocast."""
    inputs, labels = next(trainer.train_loader.forever())

    def forward() -> None:
        with trainer._autocast():
            trainer.criterion(trainer.model(inputs), labels)  # the plain module: DDP saves nothing of its own

    return saved_activation_bytes(forward, trainer.model.parameters())


def _equivalence(ctx: DistContext, cfg: Config, dataset: Dataset, accum: int, steps: int) -> dict[str, Any]:
    """One batch of B against `accum` micro-batches of B/accum, `steps` optimizer steps in float64 from the
    same weights on the same samples: the largest parameter difference over all ranks."""
    from lab.run import config
    from lab.run.cluster import dist
    from lab.run.training.trainer import Trainer

    whole = Trainer(config.with_overrides(cfg, **merged(EXACT, {"train": {"grad_accum_steps": 1}})), ctx, dataset)
    split = Trainer(config.with_overrides(cfg, **merged(EXACT, {"train": {"grad_accum_steps": accum}})), ctx, dataset)
    whole_batches, split_batches = whole.train_loader.forever(), split.train_loader.forever()
    for _ in range(steps):
        inputs, labels = next(whole_batches)
        micro = [next(split_batches) for _ in range(accum)]
        # Both loaders cut the same shuffled order of this rank's shard, one in B, one in B/k: the k
        # micro-batches are the batch split in k. Checked, because the comparison means nothing otherwise.
        if not (
            torch.equal(torch.cat([x for x, _ in micro]), inputs)
            and torch.equal(torch.cat([y for _, y in micro]), labels)
        ):
            raise RuntimeError("levers: the accumulating trainer's micro-batches are not the whole batch split")
        whole.train_step(inputs, labels)
        split.accumulated_step(iter(micro), accum)
    with torch.no_grad():
        difference = max((a - b).abs().max().item() for a, b in zip(whole.model.parameters(), split.model.parameters()))
    return {
        "max_parameter_difference": max(dist.all_gather_object(ctx, difference)),
        "dtype": "float64",
        "norm": "group",
        "accum_steps": accum,
        "batch_size_per_rank": whole.batch_size,
        "optimizer_steps": steps,
    }


def worker(argv: list[str]) -> None:
    import statistics
    from types import SimpleNamespace

    from lab.measure.bench.train import harness
    from lab.run import config, data
    from lab.run.cluster import dist, jobs, provenance
    from lab.run.training.trainer import Trainer, set_determinism

    job = jobs.this_job(argv)
    args = SimpleNamespace(**job.params)
    base = job.config
    assert base is not None  # the parent (lab.measure.bench.train.levers) hands its checked config down
    # Synthetic data for every step any trainer takes (warm-up, the rounds, the activation count, the
    # equivalence steps), so no epoch boundary falls inside a block.
    batches = max(args.warmup + args.rounds * args.steps + 2, args.equivalence_steps + 1)
    cfg = harness.synthetic_config(base, base.train.global_batch_size, batches)
    cfg = config.with_overrides(cfg, data={"uneven": "pad"}, checkpoint={"save": False}, metrics={"port_base": 0})
    with dist.initialized(cfg.dist) as ctx:
        set_determinism(False)
        dataset = data.load(cfg.data).to(ctx.device)
        chosen = variants(ctx.device.type, args.accum_steps)
        # Every rank builds the same trainers in the same order (DDP's constructor is a collective).
        trainers = {
            v.label: Trainer(config.with_overrides(cfg, **merged(PLAIN, v.overrides)), ctx, dataset) for v in chosen
        }
        entries = [Timed(v.label, trainers[v.label], trainers[v.label].plan.accumulation, True) for v in chosen]
        twins: dict[str, Timed] = {}
        if ctx.distributed:  # at world size 1 there is no all-reduce to leave out
            for v in chosen:
                if v.compute not in twins:
                    twin = Trainer(config.with_overrides(cfg, **merged(PLAIN, v.overrides)), ctx, dataset)
                    twins[v.compute] = Timed(f"no_sync {v.compute}", twin, twin.plan.accumulation, False)
        everyone = [*entries, *twins.values()]
        if args.warmup:
            for entry in everyone:
                entry.steps_of(args.warmup)()
                dist.barrier(ctx)
        for round_index in range(args.rounds):
            for entry in everyone if round_index % 2 == 0 else everyone[::-1]:
                _block(ctx, entry, args.steps)
        rows = []
        for v, entry in zip(chosen, entries):
            blocks = _slowest_rank(ctx, entry, args.steps)
            step_seconds = statistics.median(blocks)
            timed_twin = twins.get(v.compute)
            twin_seconds = statistics.median(_slowest_rank(ctx, timed_twin, args.steps)) if timed_twin else None
            trainer = entry.trainer
            rows.append(
                {
                    "label": v.label,
                    "group": v.group,
                    "what": v.what,
                    "step_seconds": step_seconds,
                    "block_step_seconds": blocks,
                    "samples_per_second": cfg.train.global_batch_size / step_seconds,
                    "no_sync_step_seconds": twin_seconds,
                    "communication_share": max(0.0, 1 - twin_seconds / step_seconds) if twin_seconds else None,
                    "peak_memory_bytes": max(dist.all_gather_object(ctx, entry.peak_bytes or 0)) or None,
                    "step_memory_bytes": max(dist.all_gather_object(ctx, entry.step_peak_bytes or 0)) or None,
                    "activation_bytes": _activations(trainer),
                    "loss": entry.loss,
                    "autocast": str(trainer.amp_dtype).removeprefix("torch.") if trainer.amp_dtype else None,
                    "accum_steps": trainer.plan.accumulation,
                    "micro_batch_per_rank": trainer.batch_size,
                    "bucket_cap_mb": trainer.cfg.dist.bucket_cap_mb,
                    "gradient_as_bucket_view": trainer.cfg.dist.gradient_as_bucket_view,
                }
            )
        del trainers, entries, twins, everyone
        equivalence = _equivalence(ctx, cfg, dataset, args.accum_steps, args.equivalence_steps)
        if ctx.is_primary:
            job.report(
                ctx.global_rank,
                {
                    "rows": rows,
                    "equivalence": equivalence,
                    "world_size": ctx.world_size,
                    "device": provenance.describe(ctx)["device_name"],
                    "device_type": ctx.device.type,
                    "threads": torch.get_num_threads(),
                    "data": dataset.description.split(" (")[0],
                    "global_batch_size": cfg.train.global_batch_size,
                    "batch_size_per_rank": cfg.train.global_batch_size // ctx.world_size,
                },
            )


if __name__ == "__main__":
    worker(sys.argv[1:])
