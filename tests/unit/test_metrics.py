"""The exporter turns the trainer's rows into labelled series, with a private registry per rank."""

from __future__ import annotations

import urllib.request

import torch

from lab import metrics
from lab.config import MetricsConfig


def _row(step: int) -> dict:
    return {"kind": "train", "step": step, "epoch": 0, "loss": 1.5, "accuracy": 0.25, "lr": 0.1,
            "samples_per_second": 200.0, "rank_samples_per_second": 100.0, "rank_samples": 64,
            "step_time_seconds": 0.32, "time": 1.7e9}


def test_rows_become_labelled_series_served_over_http():
    labels = {"run_id": "r1", "rank": "1", "node": "n"}
    exporter = metrics.RankExporter(0, "127.0.0.1", labels, torch.device("cpu"), {"torch": torch.__version__})
    try:
        exporter(_row(4))
        exporter(_row(10))
        exporter({"kind": "eval", "test_loss": 0.9, "test_accuracy": 0.7})
        exporter.record_recovery(restarts=1, steps_redone=3)
        text = urllib.request.urlopen(exporter.endpoint, timeout=5).read().decode()
    finally:
        exporter.close()
    assert 'lab_train_samples_per_second{node="n",rank="1",run_id="r1"} 100.0' in text  # this rank's own rate
    assert 'lab_train_steps_total{node="n",rank="1",run_id="r1"} 10.0' in text           # 4 + 6
    assert 'lab_train_samples_total{node="n",rank="1",run_id="r1"} 128.0' in text
    assert 'lab_eval_accuracy_ratio{node="n",rank="1",run_id="r1"} 0.7' in text
    assert 'lab_train_restarts_total{node="n",rank="1",run_id="r1"} 1.0' in text
    assert 'lab_train_steps_redone_total{node="n",rank="1",run_id="r1"} 3.0' in text
    assert 'lab_run_info{node="n",rank="1",run_id="r1",torch=' in text
    assert exporter.target() == {"targets": [f"127.0.0.1:{exporter.port}"], "labels": labels}


def test_metrics_off_is_a_null_exporter():
    exporter = metrics.start(MetricsConfig(port_base=0), None, "r", {})
    assert isinstance(exporter, metrics.NullExporter) and exporter.target() is None
    exporter(_row(1))  # accepts rows, does nothing
