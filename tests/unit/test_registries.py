"""A strategy and a benchmark added through the registries alone: one table line each (plus their code, here), and
the config, the rules, the strategy builder, the CLI, `lab bench strategies` and `lab choose` all see them; the
teaching layer's own tables (a report section, a workshop part) show the benchmark without it knowing. In-process
and small: the point is the wiring, not training (tests/distributed trains the real ones).
"""

from __future__ import annotations

import json

import pytest
import torch

from lab import cli
from lab.course.teaching import parts, report, sections, workshop
from lab.errors import ConfigError, LabError
from lab.measure.bench import registry
from lab.measure.bench.train import strategies as strategies_bench
from lab.measure.sizing import choose, choose_output
from lab.run import config
from lab.run.cluster.dist import DistContext
from lab.run.config import strategies as table
from lab.run.training import model as models
from lab.run.training import strategies
from lab.run.training.strategies.ddp import DDPStrategy
from tests.markdown import problems

HERE = __name__  # this module holds the registered code: the tables name it as any module


class FakeStrategy(DDPStrategy):
    """DDP under another name: what a new strategy's module would hold."""

    name = "fake"


def _fake_refuses(cfg) -> list[tuple[bool, str]]:
    return [(cfg.train.amp == "fp16", "train.amp: fp16 is what the fake cannot honour; use train.amp=bf16")]


@pytest.fixture
def fake_strategy(monkeypatch):
    monkeypatch.setitem(
        table.STRATEGIES,
        "fake",
        table.StrategyRow(
            "fake",
            f"{HERE}.FakeStrategy",
            "DDP under another name, registered by a test",
            refuses=_fake_refuses,
            bench=(table.BenchRow("FAKE", 2, "DDP"),),
            chooses={"ddp": ()},
        ),
    )


def test_the_config_accepts_a_registered_strategy_and_runs_its_rules(fake_strategy):
    assert config.load(None, ["dist.strategy=fake"]).dist.strategy == "fake"
    with pytest.raises(ConfigError, match=r"^<defaults>: dist.strategy=fake: train.amp: fp16 is what the fake cannot"):
        config.load(None, ["dist.strategy=fake", "train.amp=fp16"])
    with pytest.raises(ConfigError, match="dist.zero_stage: 3 applies to dist.strategy=deepspeed only"):
        config.load(None, ["dist.strategy=fake", "dist.zero_stage=3"])
    assert "fake (DDP under another name, registered by a test)" in config.describe()


def test_a_strategy_without_rules_refuses_nothing_and_an_unknown_one_is_one_line(monkeypatch):
    monkeypatch.setitem(table.STRATEGIES, "bare", table.StrategyRow("bare", f"{HERE}.FakeStrategy", "no rules"))
    assert config.load(None, ["dist.strategy=bare", "train.amp=fp16"]).dist.strategy == "bare"
    with pytest.raises(
        ConfigError, match=r"'nope' is not allowed; expected one of ddp, fsdp, deepspeed, horovod, bare$"
    ):
        config.load(None, ["dist.strategy=nope"])


def test_the_builder_imports_the_registered_class(fake_strategy):
    cfg = config.load("smoke", ["model.width=8", "dist.strategy=fake"])
    ctx = DistContext(0, 0, 1, 1, 0, torch.device("cpu"), None)
    built = strategies.build(cfg, ctx, models.build(cfg.model))
    assert isinstance(built, FakeStrategy) and built.describe() == {"strategy": "fake"}


def test_the_strategies_bench_and_lab_choose_name_it(fake_strategy):
    rows = strategies_bench.strategy_rows()
    assert [label for label, *_ in rows] == ["DDP", "FSDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "Horovod", "FAKE"]
    assert ("FAKE", "fake", 2, "DDP") in rows
    choice = choose.decide(choose.Request(params=125e6))
    assert choice.strategy == "ddp" and choice.lab_train == "lab train --config ddp --nproc-per-node 8"
    assert "note: the lab's dist.strategy=fake trains this choice too" in choose_output.render(choice)


# ----------------------------------------------------------------------------- a benchmark


def fake_arguments(p) -> None:
    p.add_argument("--value", type=int, default=7, help="what the fake measures")
    p.add_argument("--json", metavar="PATH")


def fake_run(args) -> int:
    with open(args.json, "w") as f:
        json.dump({"benchmark": "fake", "value": args.value}, f)
    return 0


def fake_section(results, out) -> str:
    return "\n".join(["## Fake benchmark", "", *[f"Measured {r['value']}." for r in results], ""])


def fake_workshop_steps(host: parts.WorkshopHost) -> list[parts.WorkshopStep]:
    return [
        parts.WorkshopStep(
            f"fake over {host.ranks} ranks",
            host.ranks,
            [*host.lab, "bench", "fake", "--value", "1", "--json", str(host.folder / "fake.json")],
        )
    ]


@pytest.fixture
def fake_benchmark(monkeypatch):
    monkeypatch.setitem(
        registry.BENCHMARKS,
        "fake",
        registry.Benchmark("fake", "a benchmark registered by a test", fake_arguments, fake_run),
    )
    monkeypatch.setitem(sections.SECTIONS, "fake", sections.Section(fake_section))
    monkeypatch.setitem(parts.PARTS, "fake", fake_workshop_steps)


def test_a_benchmark_without_a_section_or_part_runs_and_the_report_and_workshop_leave_it_out(monkeypatch, tmp_path):
    monkeypatch.setitem(
        registry.BENCHMARKS,
        "fake",
        registry.Benchmark("fake", "a benchmark registered by a test", fake_arguments, fake_run),
    )
    result = tmp_path / "fake.json"
    assert cli.main(["bench", "fake", "--value", "3", "--json", str(result)]) == 0
    with pytest.raises(LabError, match="no run directories or benchmark results found"):  # not a result it shows
        report.build([str(tmp_path)])
    assert "fake" not in workshop.parts(None)


def test_the_cli_parses_and_runs_a_registered_benchmark_and_the_report_renders_it(fake_benchmark, tmp_path):
    result = tmp_path / "fake.json"
    assert cli.main(["bench", "fake", "--value", "3", "--json", str(result)]) == 0
    assert json.loads(result.read_text()) == {"benchmark": "fake", "value": 3}
    text = report.build([str(tmp_path)]).read_text()
    assert "## Fake benchmark\n\nMeasured 3.\n" in text and problems(text) == []


def test_the_workshop_plans_a_registered_benchmark_as_its_last_part(fake_benchmark, tmp_path):
    assert workshop.parts(None)[-1] == "fake" and workshop.parts("fake") == ["fake"]
    steps = workshop.plan(config.load("smoke"), "smoke", [], [2], 0, tmp_path)
    fake = [s for s in steps if s.part == "fake"]
    assert [(s.title, s.processes) for s in fake] == [("fake over 2 ranks", 2)]
    assert fake[0].command[-2:] == ["--json", str(tmp_path / "fake.json")]


def test_bad_input_to_a_registered_benchmark_is_one_line_and_exit_2(fake_benchmark, capsys):
    assert cli.main(["bench", "fake", "--value", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--value: invalid int value: 'x'" in err


def test_the_parser_is_the_command_table():
    parser = cli.build_parser()
    group = next(a for a in parser._actions if a.dest == "command")  # argparse keeps subparsers there
    assert list(group.choices) == [c.name for c in cli.COMMANDS]
    bench = next(a for a in group.choices["bench"]._actions if a.dest == "bench_command")
    # the registry's rows, then the device check under its old name (`lab gpu-check` now), an alias that says so
    assert list(bench.choices) == [*registry.BENCHMARKS, "gpu-check"]
