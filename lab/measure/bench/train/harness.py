"""What the benchmarks that time the lab's real training step share: a Trainer set up and torn
down, a clock that waits for the device, and the order of interleaved A/B blocks.

    with trainer_session(synthetic_config(cfg, global_batch_size=256, batches=60)) as (ctx, trainer, dataset):
        batches = trainer.train_loader.forever()
        seconds = timed(ctx, lambda: trainer.train_step(*next(batches)))

`scaling`, `pipeline` and `metrics_overhead` build on these; each times its own blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `lab bench --help` must not wait for torch
    from lab.run.cluster.dist import DistContext
    from lab.run.config import Config
    from lab.run.data import Dataset
    from lab.run.training.trainer import Trainer


def synthetic_config(cfg: Config, global_batch_size: int, batches: int) -> Config:
    """`cfg` training on `batches` batches of generated data at `global_batch_size`, one micro-batch per step:
    no file is read, so every machine times the same work."""
    from lab.run import config

    return config.with_overrides(
        cfg,
        data={"source": "synthetic", "synthetic_train_size": global_batch_size * batches, "synthetic_test_size": 10},
        train={"global_batch_size": global_batch_size, "grad_accum_steps": 1},
    )


@contextlib.contextmanager
def trainer_session(cfg: Config) -> Iterator[tuple[DistContext, Trainer, Dataset]]:
    """(this rank's context, a Trainer of `cfg`, its data set on the device); the process group is torn
    down when the block ends, however it ends. Not deterministic: cuDNN autotunes, as a timed run would."""
    from lab.run import data
    from lab.run.cluster import dist
    from lab.run.training.trainer import Trainer, set_determinism

    with dist.initialized(cfg.dist) as ctx:
        set_determinism(False)
        dataset = data.load(cfg.data).to(ctx.device)
        yield ctx, Trainer(cfg, ctx, dataset), dataset


def timed(ctx: DistContext, work: Callable[[], object], barrier: bool = False) -> float:
    """Seconds `work` takes, device time included: CUDA runs asynchronously, so the clock starts after the
    device has finished what came before and stops after it has finished `work`'s kernels. `barrier`: start
    every rank together, so a rank's block does not include waiting for a late one.

    >>> from types import SimpleNamespace
    >>> cpu = SimpleNamespace(device=SimpleNamespace(type="cpu"), distributed=False)
    >>> 0.05 <= timed(cpu, lambda: time.sleep(0.05)) < 1
    True
    """
    _synchronize(ctx)
    if barrier:
        from lab.run.cluster import dist

        dist.barrier(ctx)
    started = time.perf_counter()
    work()
    _synchronize(ctx)
    return time.perf_counter() - started


def abba(rounds: int) -> Iterator[bool]:
    """Which setting each block of `rounds` A/B pairs runs (True: A), in ABBA order: neither always runs
    first, so slow drifts of the machine (clock boost, heat, caches) fall on both alike.

    >>> "".join("A" if a else "B" for a in abba(3))
    'ABBAAB'
    """
    for round_index in range(rounds):
        yield from (True, False) if round_index % 2 == 0 else (False, True)


def _synchronize(ctx: DistContext) -> None:
    if ctx.device.type == "cuda":
        import torch

        torch.cuda.synchronize(ctx.device)
