"""Every rule between config fields, in one place: refused in one line when the config loads, before torchrun starts
a process (`check`), or once the world size is known (`check_layout`).

A strategy's own refusals (what it cannot honour) are functions here that its row in lab.run.config.strategies names;
each strategy's module says why (lab/run/training/strategies/). The table is handed to `check`, not imported: the
table names these functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from lab.errors import ConfigError

if TYPE_CHECKING:
    from lab.run.config import Config


class StrategyRules(Protocol):
    """What the rules read of a strategy's row (lab.run.config.strategies.StrategyRow, which names this module's
    refusal functions: the table imports the rules, never the other way round)."""

    # Read-only (properties), as the frozen row's fields are: a plain attribute here would ask for a settable one.
    @property
    def zero_stages(self) -> tuple[int, ...]: ...
    @property
    def refuses(self) -> Callable[[Config], list[tuple[bool, str]]] | None: ...


def check(cfg: Config, strategies: Mapping[str, StrategyRules]) -> None:
    """Rules between fields that do not depend on the world size; `strategies` is the strategy table."""
    if cfg.data.uneven == "join" and cfg.train.grad_accum_steps != 1:
        raise ConfigError(
            f"{cfg.origin}: data.uneven: join needs train.grad_accum_steps=1 "
            f"(got {cfg.train.grad_accum_steps}); use data.uneven=pad or drop with accumulation"
        )
    if cfg.dist.static_graph and cfg.train.grad_accum_steps > 1:
        # DDP's reducer asserts (expect_autograd_hooks_) on the first backward inside no_sync() with a static
        # graph, and the proposed fix would silently stop all-reducing gradients: refuse the pair.
        raise ConfigError(
            f"{cfg.origin}: dist.static_graph: true cannot be combined with train.grad_accum_steps="
            f"{cfg.train.grad_accum_steps} (DDP's no_sync fails with a static graph, PyTorch issue "
            f"143580); set dist.static_graph=false or train.grad_accum_steps=1"
        )
    _check_strategy(cfg, strategies)
    if cfg.train.global_batch_size % cfg.train.grad_accum_steps:
        _indivisible(cfg, 1)
    if cfg.model.sync_batchnorm and cfg.model.norm != "batch":
        raise ConfigError(f"{cfg.origin}: model.sync_batchnorm: needs model.norm=batch (got {cfg.model.norm})")
    if cfg.model.sync_batchnorm and cfg.data.uneven == "join":
        # DDP's Join shadows only its own gradient all-reduce; SyncBatchNorm's all-gather in the forward of the
        # ranks still training would wait for the finished rank until the NCCL watchdog kills the job.
        raise ConfigError(
            f"{cfg.origin}: model.sync_batchnorm: true cannot be combined with data.uneven=join (Join "
            f"does not cover SyncBatchNorm's all-gather: the other ranks hang); use data.uneven=pad "
            f"or drop, or model.sync_batchnorm=false"
        )


def _check_strategy(cfg: Config, strategies: Mapping[str, StrategyRules]) -> None:
    """What the chosen strategy cannot honour; a row without refusals refuses nothing."""
    chosen = strategies[cfg.dist.strategy]  # the field's check accepted only the table's names
    if cfg.dist.zero_stage != 2 and cfg.dist.zero_stage not in chosen.zero_stages:
        staged = [name for name, s in strategies.items() if cfg.dist.zero_stage in s.zero_stages]
        raise ConfigError(
            f"{cfg.origin}: dist.zero_stage: {cfg.dist.zero_stage} applies to dist.strategy="
            f"{' or '.join(staged)} only (this run: {cfg.dist.strategy}); set dist.strategy="
            f"{staged[0] if staged else '...'}, or drop the key (fsdp shards everything, as ZeRO-3)"
        )
    for refused, line in chosen.refuses(cfg) if chosen.refuses else ():
        if refused:
            raise ConfigError(f"{cfg.origin}: dist.strategy={cfg.dist.strategy}: {line}")


def fsdp_refuses(cfg: Config) -> list[tuple[bool, str]]:
    """What the lab's FSDP strategy cannot honour (lab/run/training/strategies/fsdp.py)."""
    return [
        (
            cfg.train.amp == "fp16",
            "train.amp: fp16 needs a sharded gradient scaler the lab does not wire for FSDP; use train.amp=bf16",
        ),
        (cfg.data.uneven == "join", "data.uneven: join needs DDP's Join and FSDP has none; use pad or drop"),
        (cfg.model.sync_batchnorm, "model.sync_batchnorm: SyncBatchNorm is DDP's; use model.norm=group, or ddp"),
        (cfg.dist.static_graph, "dist.static_graph: true is a DDP setting; set dist.static_graph=false"),
    ]


def deepspeed_refuses(cfg: Config) -> list[tuple[bool, str]]:
    """What the lab's DeepSpeed engine cannot honour (lab/run/training/strategies/deepspeed.py)."""
    m = cfg.model
    return [
        (
            cfg.data.uneven == "join",
            "data.uneven: join uses DDP's Join context, which DeepSpeed has no "
            "counterpart for; use data.uneven=pad or drop",
        ),
        (
            m.compile,
            "model.compile: true is not mapped (DeepSpeed has engine.compile() and ZeRO-3 hooks of its "
            "own); set model.compile=false",
        ),
        *_ddp_options(cfg),
        (
            m.dtype != "float32",
            f"model.dtype: {m.dtype} would silently train float32 master copies (ZeRO's "
            f"partitions are .float()); set model.dtype=float32",
        ),
    ]


def horovod_refuses(cfg: Config) -> list[tuple[bool, str]]:
    """What the lab's Horovod strategy cannot honour (lab/run/training/strategies/horovod.py)."""
    m = cfg.model
    return [
        (
            cfg.data.uneven == "join",
            "data.uneven: join uses DDP's Join context; Horovod's hvd.join is not wired; use data.uneven=pad or drop",
        ),
        (
            m.compile,
            "model.compile: true is not mapped (Horovod's gradient hooks sit on the eager parameters); "
            "set model.compile=false",
        ),
        (
            m.sync_batchnorm,
            "model.sync_batchnorm: true is not mapped to hvd.SyncBatchNorm; set "
            "model.sync_batchnorm=false, or model.norm=group for batch-independent norms",
        ),
        *_ddp_options(cfg),
    ]


def _ddp_options(cfg: Config) -> list[tuple[bool, str]]:
    """DDP's own keys, set away from their defaults: a strategy without DDP's wrapper cannot honour them."""
    d = cfg.dist
    return [
        (d.static_graph, "dist.static_graph: true is a DDP option; set dist.static_graph=false"),
        (d.broadcast_buffers, "dist.broadcast_buffers: true is a DDP option; set dist.broadcast_buffers=false"),
        (not d.gradient_as_bucket_view, "dist.gradient_as_bucket_view: false is a DDP option; drop the key"),
    ]


# ----------------------------------------------------------------------------- rules that need the world size


def check_layout(cfg: Config, world_size: int) -> None:
    """The global batch must split into equal micro-batches over ranks and accumulation steps."""
    if cfg.train.global_batch_size % (world_size * cfg.train.grad_accum_steps):
        _indivisible(cfg, world_size)


def batch_size_per_rank(cfg: Config, world_size: int) -> int:
    """Samples in one micro-batch on one rank: arithmetic on a layout `check_layout` passed (where it did not, the
    same one-line refusal rather than a wrong batch)."""
    batch, rest = divmod(cfg.train.global_batch_size, world_size * cfg.train.grad_accum_steps)
    if rest:
        _indivisible(cfg, world_size)
    return batch


def _indivisible(cfg: Config, world_size: int) -> None:
    b, a = cfg.train.global_batch_size, cfg.train.grad_accum_steps
    unit = world_size * a
    lower, upper = max(unit, b // unit * unit), (b // unit + 1) * unit
    raise ConfigError(
        f"{cfg.origin}: train.global_batch_size: {b} is not divisible by world size {world_size} x "
        f"train.grad_accum_steps {a} = {unit}; use a multiple of {unit} such as {lower} or {upper}"
    )
