"""The exporter turns the trainer's rows into labelled series, with a private registry per rank."""

from __future__ import annotations

import urllib.request

import torch

from lab.run.config import MetricsConfig
from lab.run.observability import metrics


def _row(step: int) -> dict:
    return {
        "kind": "train",
        "step": step,
        "epoch": 0,
        "loss": 1.5,
        "accuracy": 0.25,
        "lr": 0.1,
        "samples_per_second": 200.0,
        "rank_samples_per_second": 100.0,
        "rank_samples": 64,
        "step_time_seconds": 0.32,
        "time": 1.7e9,
    }


def test_rows_become_labelled_series_served_over_http():
    labels = {"run_id": "r1", "rank": "1", "node": "n"}
    exporter = metrics.RankExporter(0, "127.0.0.1", labels, torch.device("cpu"), {"torch": torch.__version__})
    try:
        exporter(_row(4))
        exporter(_row(10))
        exporter({"kind": "eval", "test_loss": 0.9, "test_accuracy": 0.7})
        exporter.record_recovery(restarts=1, steps_redone=3)
        exporter.record_hang(
            {"ranks": [{"rank": 0, "state": "waiting", "op": "all_reduce", "seq": 7}, {"rank": 1, "state": "dead"}]}
        )
        text = urllib.request.urlopen(exporter.endpoint, timeout=5).read().decode()
    finally:
        exporter.close()
    assert 'lab_train_samples_per_second{node="n",rank="1",run_id="r1"} 100.0' in text  # this rank's own rate
    assert 'lab_train_steps_total{node="n",rank="1",run_id="r1"} 10.0' in text  # 4 + 6
    assert 'lab_train_samples_total{node="n",rank="1",run_id="r1"} 128.0' in text
    assert 'lab_eval_accuracy_ratio{node="n",rank="1",run_id="r1"} 0.7' in text
    assert 'lab_train_restarts_total{node="n",rank="1",run_id="r1"} 1.0' in text
    assert 'lab_train_steps_redone_total{node="n",rank="1",run_id="r1"} 3.0' in text
    assert 'lab_run_info{node="n",rank="1",run_id="r1",torch=' in text
    hung = 'lab_train_hang_rank_info{collective="all_reduce #7",hung_rank="0",node="n",rank="1",run_id="r1",state='
    assert hung + '"waiting"} 1.0' in text
    assert 'hung_rank="1",node="n",rank="1",run_id="r1",state="dead"} 1.0' in text
    assert exporter.target() == {"targets": [f"127.0.0.1:{exporter.port}"], "labels": labels}


def test_metrics_off_is_a_null_exporter():
    exporter = metrics.start(MetricsConfig(port_base=0), None, "r", {})
    assert isinstance(exporter, metrics.NullExporter) and exporter.target() is None
    exporter(_row(1))  # accepts rows, does nothing


class FakeNvml:
    """Stands in for nvidia-ml-py (pynvml): no GPU or driver here. A host of four GPUs, found by UUID or index."""

    UUIDS = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]
    MIGS = {"MIG-eeee": 3}  # a MIG instance on GPU 3

    def __init__(self) -> None:
        self.nvmlInit = lambda: None
        self.nvmlSystemGetDriverVersion = lambda: "570.86.15"
        self.nvmlDeviceGetHandleByIndex = lambda index: ("handle", index)
        self.nvmlDeviceGetIndex = lambda handle: handle[1]
        self.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda mig: ("handle", self.MIGS[mig[1]])

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid in self.MIGS:
            return ("mig", uuid)
        if uuid not in self.UUIDS:
            raise LookupError(f"NVML_ERROR_NOT_FOUND: {uuid}")
        return ("handle", self.UUIDS.index(uuid))


def test_nvml_picks_the_gpu_by_uuid_when_cuda_visible_devices_lists_uuids(monkeypatch):
    # Docker --gpus device=GPU-cccc (or Slurm, Kubernetes): the process sees one GPU, cuda:0, which is the
    # host's GPU 2. A digit index read from CUDA_VISIBLE_DEVICES would pick GPU 0: another GPU's numbers.
    import sys

    from lab.run.cluster import nvml

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc")
    monkeypatch.setattr(nvml, "torch_uuid", lambda index: ["cccc"][index])  # torch's form: bare hex
    notices = []
    sampler = metrics._Nvml(torch.device("cuda", 0), notices.append)
    assert notices == []
    assert sampler.handle == ("handle", 2) and sampler.gpu == "2"
    assert nvml.driver_version() == "570.86.15"
    # a MIG instance: found as MIG-<uuid>, labelled with its parent GPU's index
    monkeypatch.setattr(nvml, "torch_uuid", lambda index: "eeee")
    assert nvml.gpu_of(0) == (("mig", "MIG-eeee"), 3, "MIG-eeee")


def test_nvml_absent_is_one_notice_not_a_failure(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    notices = []
    sampler = metrics._Nvml(torch.device("cuda", 0), notices.append)
    assert sampler.handle is None and len(notices) == 1 and "NVML not available" in notices[0]
