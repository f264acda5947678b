"""The Horovod strategy's torch-free parts: horovodrun's environment read as the lab's layout, the refusals
before anything starts, the rows `lab bench strategies --rows` picks, and the timeline summary of a file cut
short. tests/distributed/test_horovod.py trains under real horovodrun."""

from __future__ import annotations

import json

import pytest

from lab.errors import ConfigError, LabError
from lab.measure.bench.train import strategies as bench
from lab.run import config
from lab.run.cluster import horovodrun, torchrun_env
from lab.run.observability import horovod_timeline
from tests.conftest import lab

HOROVODRUN_ENV = {
    "HOROVOD_RANK": "1",
    "HOROVOD_SIZE": "2",
    "HOROVOD_LOCAL_RANK": "1",
    "HOROVOD_LOCAL_SIZE": "2",
    "HOROVOD_CROSS_RANK": "0",
}


def test_a_process_horovodrun_started_has_its_layout_and_torchruns_wins_where_both_are_set(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in HOROVODRUN_ENV.items():
        monkeypatch.setenv(name, value)
    assert torchrun_env.layout() == torchrun_env.Layout(1, 1, 2, 2, 0)
    assert not torchrun_env.is_primary_process()  # rank 1 of horovodrun's job prints no error of its own
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert torchrun_env.layout().world_size == 4


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("model.compile", "true", "model.compile: true is not mapped"),
        ("model.sync_batchnorm", "true", "model.sync_batchnorm: true is not mapped to hvd.SyncBatchNorm"),
        ("data.uneven", "join", "data.uneven: join uses DDP's Join context"),
        ("dist.static_graph", "true", "dist.static_graph: true is a DDP option"),
    ],
)
def test_what_horovod_cannot_honour_is_refused_at_config_load(key, value, said):
    with pytest.raises(ConfigError, match=said):
        config.load("smoke", ["dist.strategy=horovod", f"{key}={value}"])


def test_horovodruns_missing_imports_are_one_line(monkeypatch):
    # Mocked: the lookup finds Horovod (built or not: make test builds it first) and misses its launcher's imports.
    monkeypatch.setattr(horovodrun, "_found", lambda name: name not in ("cloudpickle", "psutil"))
    with pytest.raises(
        LabError,
        match=r"^horovodrun cannot start: cloudpickle, psutil missing in .*pip install "
        r"cloudpickle psutil, or third_party/horovod/build.sh",
    ) as error:
        horovodrun.check_installed()
    assert "\n" not in str(error.value)


def test_rows_picks_ddp_and_the_named_and_refuses_an_unknown_label():
    assert [label for label, *_ in bench.chosen_rows("zero-3,Horovod")] == ["DDP", "ZeRO-3", "Horovod"]
    assert [label for label, *_ in bench.chosen_rows(None)][-1] == "Horovod"
    proc = lab("bench", "strategies", "--rows", "DDP,Horovd", "--steps", "2", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "--rows: horovd is not a row; use labels among DDP, FSDP, ZeRO-1, ZeRO-2, ZeRO-3, Horovod"
    )


def test_a_timeline_cut_short_reads_and_its_fused_share_is_said(tmp_path):
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.fc.weight"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.fc.bias"}},
    ]
    for pid in (1, 2):
        events += [
            {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": pid},
            {"ph": "E", "ts": 40, "pid": pid},
            {"ph": "B", "name": "ALLREDUCE", "ts": 40, "pid": pid},
            {"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 40, "pid": pid},
            {"ph": "E", "ts": 45, "pid": pid},
            {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 45, "pid": pid},
            {"ph": "E", "ts": 95, "pid": pid},
            {"ph": "E", "ts": 100, "pid": pid},
        ]
    path = tmp_path / horovod_timeline.FILE
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")  # Horovod still writing: no "]"
    summary = horovod_timeline.summarise(path, steps=1)
    assert summary["tensors"] == 2 and summary["span_us"] == 100
    assert {k: (p["tensor_spans"], p["wall_us"]) for k, p in summary["phases"].items()} == {
        "NEGOTIATE_ALLREDUCE": (2, 40),
        "ALLREDUCE": (2, 60),
        "MEMCPY_IN_FUSION_BUFFER": (2, 5),
        "GLOO_ALLREDUCE": (2, 50),
    }
    text = "\n".join(horovod_timeline.render(summary, "r1"))
    assert "| GLOO_ALLREDUCE | the collective on gloo | 2 | 0.1 | 50% |" in text
    assert "Tensor fusion: 2 of 2 gradient all-reduces went through the fusion buffer" in text
