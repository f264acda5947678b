"""What a strategy cannot honour, refused in one line when the config loads: before torchrun starts a process.

lab.config calls `check` for every strategy but ddp; each strategy's module says why (lab/training/strategies/).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.errors import ConfigError

if TYPE_CHECKING:
    from lab.config import Config


def check(cfg: Config) -> None:
    {"fsdp": _fsdp, "deepspeed": _deepspeed}[cfg.dist.strategy](cfg)


def _fsdp(cfg: Config) -> None:
    """What the lab's FSDP strategy cannot honour (lab/training/strategies/fsdp.py)."""
    _refuse(cfg, [
        (cfg.train.amp == "fp16", "train.amp: fp16 needs a sharded gradient scaler the lab does not wire for FSDP; "
                                  "use train.amp=bf16"),
        (cfg.data.uneven == "join", "data.uneven: join needs DDP's Join and FSDP has none; use pad or drop"),
        (cfg.model.sync_batchnorm, "model.sync_batchnorm: SyncBatchNorm is DDP's; use model.norm=group, or ddp"),
        (cfg.dist.static_graph, "dist.static_graph: true is a DDP setting; set dist.static_graph=false"),
    ])


def _deepspeed(cfg: Config) -> None:
    """What the lab's DeepSpeed engine cannot honour (lab/training/strategies/deepspeed.py)."""
    m, d = cfg.model, cfg.dist
    refused = [
        (cfg.data.uneven == "join", "data.uneven: join uses DDP's Join context, which DeepSpeed has no "
                                    "counterpart for; use data.uneven=pad or drop"),
        (m.compile, "model.compile: true is not mapped (DeepSpeed has engine.compile() and ZeRO-3 hooks of its "
                    "own); set model.compile=false"),
        (d.static_graph, "dist.static_graph: true is a DDP option; set dist.static_graph=false"),
        (d.broadcast_buffers, "dist.broadcast_buffers: true is a DDP option; set dist.broadcast_buffers=false"),
        (not d.gradient_as_bucket_view, "dist.gradient_as_bucket_view: false is a DDP option; drop the key"),
        (m.dtype != "float32", f"model.dtype: {m.dtype} would silently train float32 master copies (ZeRO's "
                               f"partitions are .float()); set model.dtype=float32"),
    ]
    _refuse(cfg, refused)


def _refuse(cfg: Config, rules: list[tuple[bool, str]]) -> None:
    for refused, line in rules:
        if refused:
            raise ConfigError(f"{cfg.origin}: dist.strategy={cfg.dist.strategy}: {line}")
