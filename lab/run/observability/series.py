"""The metric families each rank's exporter serves (lab.run.observability.metrics): names, help and labels in one place.

One registry an exporter, so tests and ranks never share state. prometheus_client is imported by the caller's
`prometheus` module (optional: training without metrics needs none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge

LABELS = ("run_id", "rank", "node")
GPU_LABELS = (*LABELS, "gpu")


class Definitions:
    """The metric families of one registry (one per exporter, so tests and ranks never share state)."""

    def __init__(self, registry: CollectorRegistry, prometheus: Any) -> None:
        Counter, Info = prometheus.Counter, prometheus.Info

        def gauge(name: str, doc: str, labels: tuple[str, ...] = LABELS) -> Gauge:
            return prometheus.Gauge(name, doc, labels, registry=registry)

        self.samples_per_second = gauge(
            "lab_train_samples_per_second",
            "Training images per second processed by this rank over the last log interval",
        )
        self.step_duration = gauge(
            "lab_train_step_duration_seconds", "Mean optimizer-step time of this rank over the last log interval"
        )
        self.loss = gauge("lab_train_loss", "Training loss (mean over all ranks) over the last log interval")
        self.accuracy = gauge("lab_train_accuracy_ratio", "Training accuracy (all ranks) over the last log interval")
        self.learning_rate = gauge("lab_train_learning_rate", "Learning rate after the last optimizer step")
        self.epoch = gauge("lab_train_epoch", "Current epoch (0-based)")
        self.steps = Counter("lab_train_steps", "Optimizer steps taken by this rank", LABELS, registry=registry)
        self.samples = Counter("lab_train_samples", "Training images processed by this rank", LABELS, registry=registry)
        self.eval_loss = gauge("lab_eval_loss", "Test loss at the last evaluation")
        self.eval_accuracy = gauge("lab_eval_accuracy_ratio", "Test accuracy at the last evaluation")
        # On a CPU the device is the host: allocated and reserved hold the process's resident memory, peak its peak.
        self.memory_allocated = gauge(
            "lab_device_memory_allocated_bytes",
            "Device memory held by tensors (torch.cuda); process resident memory on a CPU",
        )
        self.memory_reserved = gauge(
            "lab_device_memory_reserved_bytes",
            "Device memory reserved by the caching allocator; process resident memory on a CPU",
        )
        self.memory_peak = gauge(
            "lab_device_memory_peak_bytes",
            "Peak device memory held by tensors; peak resident memory of the process on a CPU",
        )
        self.gpu_used = gauge("lab_gpu_memory_used_bytes", "GPU memory in use (NVML, all processes)", GPU_LABELS)
        self.gpu_total = gauge("lab_gpu_memory_total_bytes", "GPU memory in total (NVML)", GPU_LABELS)
        self.gpu_utilization = gauge(
            "lab_gpu_utilization_ratio", "GPU busy time over the last sample period (NVML)", GPU_LABELS
        )
        self.heartbeat = gauge("lab_train_last_log_timestamp_seconds", "Unix time of this rank's last log interval")
        self.info = Info("lab_run", "The run's versions and layout", LABELS, registry=registry)
        self.restarts = Counter(
            "lab_train_restarts", "Times torchrun restarted this run's worker group", LABELS, registry=registry
        )
        self.slowest_rank = gauge(
            "lab_train_slowest_rank",
            "The rank the others waited for in the last log interval (the least gradient-communication wait, DDP)",
        )
        self.slowest_rank_lag = gauge(
            "lab_train_slowest_rank_lag_seconds",
            "How much longer the other ranks waited a step than the slowest rank did (lab.run.training.stragglers)",
        )
        self.communication_wait = gauge(
            "lab_train_communication_wait_seconds",
            "This rank's gradient communication (transfer and waiting for the peers) in its last sampled step",
        )
        self.hang = gauge(
            "lab_train_hang_rank_info",
            "1 for each rank of a hang this rank's watchdog diagnosed: its state (waiting, mismatch, elsewhere, "
            "ahead, dead, silent) and the collective it was in (lab.run.cluster.hang)",
            (*LABELS, "hung_rank", "state", "collective"),
        )
        self.hang_time = gauge("lab_train_hang_timestamp_seconds", "Unix time of this rank's last hang diagnosis")
        self.steps_redone = Counter(
            "lab_train_steps_redone",
            "Optimizer steps run again after restarts: work lost between the last checkpoint and a crash",
            LABELS,
            registry=registry,
        )
