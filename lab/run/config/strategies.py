"""The strategies the lab trains with, one row each: the table the config, the rules,
`lab.run.training.strategies.build`,
`lab bench strategies` and `lab choose` read. Adding a strategy is its module in lab/run/training/strategies/ and a row
here (what it cannot honour goes in lab.run.config.rules, named by its row).

No torch here, and no import of the implementations: the CLI and the config read this table while they parse
arguments, and DeepSpeed is an optional extra. A row names its class as a dotted string, imported when it is built.

>>> list(STRATEGIES)
['ddp', 'fsdp', 'deepspeed', 'horovod']
>>> STRATEGIES["deepspeed"].module, STRATEGIES["deepspeed"].class_name
('lab.run.training.strategies.deepspeed', 'DeepSpeedStrategy')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lab.run.config import rules

if TYPE_CHECKING:
    from lab.run.config import Config


@dataclass(frozen=True)
class BenchRow:
    """One row of `lab bench strategies`: its label, the dist.zero_stage it runs with, and the row of `lab memory`'s
    estimate that shards and copies as it does (the benchmark trains fp32, where ZeRO-3 and FSDP are two rows)."""

    label: str
    zero_stage: int
    estimate: str


@dataclass(frozen=True)
class StrategyRow:
    name: str  # the dist.strategy value
    implementation: str  # "package.module.Class", imported only when built
    help: str  # one line, for --help-config
    refuses: Callable[[Config], list[tuple[bool, str]]] | None = None  # (refused?, why and what to set) pairs
    zero_stages: tuple[int, ...] = ()  # the dist.zero_stage values it honours (none: the key is refused)
    bench: tuple[BenchRow, ...] = ()  # its rows in `lab bench strategies`
    # The `lab choose` answers it trains, each with the --set lines beyond dist.strategy that select it.
    chooses: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return self.implementation.rpartition(".")[0]

    @property
    def class_name(self) -> str:
        return self.implementation.rpartition(".")[2]


DEFAULT = "ddp"  # dist.strategy's default: a `lab train` line for it needs no --set

# In the order `lab bench strategies` runs them and `lab choose` prefers them.
STRATEGIES: dict[str, StrategyRow] = {
    s.name: s
    for s in (
        StrategyRow(
            "ddp",
            "lab.run.training.strategies.ddp.DDPStrategy",
            "the whole model on every rank, gradients all-reduced in buckets; at world size 1 no wrapper",
            bench=(BenchRow("DDP", 2, "DDP"),),
            chooses={"ddp": ()},
        ),
        StrategyRow(
            "fsdp",
            "lab.run.training.strategies.fsdp.FSDPStrategy",
            "FSDP2 fully_shard per ResNet stage",
            refuses=rules.fsdp_refuses,
            bench=(BenchRow("FSDP", 2, "FSDP full shard"),),
            chooses={"fsdp-full": (), "fsdp-hybrid": ()},
        ),
        StrategyRow(
            "deepspeed",
            "lab.run.training.strategies.deepspeed.DeepSpeedStrategy",
            "a DeepSpeed engine with ZeRO stage dist.zero_stage; the [deepspeed] extra",
            refuses=rules.deepspeed_refuses,
            zero_stages=(1, 2, 3),
            bench=(BenchRow("ZeRO-1", 1, "ZeRO-1"), BenchRow("ZeRO-2", 2, "ZeRO-2"), BenchRow("ZeRO-3", 3, "ZeRO-3")),
            chooses={"zero-1": ("dist.zero_stage=1",), "zero-2": ("dist.zero_stage=2",)},
        ),
        StrategyRow(
            "horovod",
            "lab.run.training.strategies.horovod.HorovodStrategy",
            "Horovod's DistributedOptimizer, launched by horovodrun; built by third_party/horovod/build.sh",
            refuses=rules.horovod_refuses,
            bench=(BenchRow("Horovod", 2, "DDP"),),
        ),
    )
}


def names() -> dict[str, str]:
    """Each strategy's name and one-line help, in the table's order: dist.strategy's allowed values."""
    return {name: s.help for name, s in STRATEGIES.items()}


def training(answer: str) -> list[StrategyRow]:
    """The strategies that train `lab choose`'s `answer` (ddp, zero-1, fsdp-full, ...), preferred first."""
    return [s for s in STRATEGIES.values() if answer in s.chooses]
