"""Every Prometheus metric of the lab, defined once; the per-rank exporter; Pushgateway summaries.

Names follow Prometheus conventions: the `lab_` prefix, base units (`_seconds`,
`_bytes`, `_ratio`), `_total` on counters, `_info` for metadata. Labels are bounded:
`run_id`, `rank` (global rank), `node` (host name) — never a step or a value; in a workshop room each run's file_sd
targets and pushed group add `seat` (lab.run.cluster.seat), so Prometheus labels all its series with it. Each rank
scrapes its own figures, so a sum over `rank` is the run's total:

    sum by (run_id) (lab_train_samples_per_second)       # images/s of the whole run

The Pushgateway gets one group per run, pushed by rank 0 alone under (job, run_id): the
run-wide figures (`lab_run_*`) once, with no `rank` label, so no sum over ranks can count
them twice; the one per-rank figure of the summary (peak memory) labelled by rank. A run
that ends again (after a restart) replaces its group: nothing of an earlier start stays.

Each rank serves /metrics on `metrics.port_base + local_rank`, at the address `listen_address`
chooses (reachable from other hosts on a multi-node run). The trainer calls the exporter at log
intervals with numbers it has already synced: no extra host sync.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from lab import __version__, atomic, optional
from lab.run.cluster import seat, torchrun_env
from lab.run.cluster.addresses import is_loopback, is_wildcard
from lab.run.observability.series import LABELS, Definitions  # noqa: F401 (LABELS: the exporters' targets read it)

if TYPE_CHECKING:  # types only: prometheus_client is optional, torch is imported by the first device sample
    import torch
    from prometheus_client import Gauge

    from lab.run.cluster.dist import DistContext
    from lab.run.config import MetricsConfig

ROOM_JOB = "lab-room"  # the Pushgateway job of a workshop room's groups (lessons' checks, seats' GPUs)
Sample = tuple[str, str, dict[str, str], float]  # one pushed gauge: (name, help, labels, value)


def _prometheus() -> ModuleType:
    """prometheus_client, imported when an exporter or a push is asked for: training without metrics needs none."""
    return optional.require("prometheus_client", "the Prometheus exporter (metrics.port_base, metrics.pushgateway)")


# ----------------------------------------------------------------------------- the per-rank exporter


class NullExporter:
    """What ranks get when metrics are off: accepts rows, does nothing."""

    endpoint: str | None = None  # a RankExporter's /metrics URL

    def __call__(self, row: dict[str, Any]) -> None:
        pass

    def target(self) -> dict[str, Any] | None:
        """This rank's entry of a Prometheus file_sd target file: none without an exporter."""
        return None

    def record_recovery(self, restarts: int, steps_redone: int) -> None:
        pass

    def record_hang(self, diagnosis: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class RankExporter(NullExporter):
    def __init__(
        self,
        port: int,
        bind_address: str,
        labels: dict[str, str],
        device: torch.device,
        info: dict[str, str],
        say: Callable[[str], None] = print,
        advertise: str | None = None,
    ) -> None:
        """Serve on bind_address:port; `advertise` is the host other machines reach it by (default: the bind
        address, or this host's name for a wildcard)."""
        prometheus = _prometheus()
        self.registry = prometheus.CollectorRegistry()
        self.series = Definitions(self.registry, prometheus)
        self.labels, self.device = labels, device
        self.server, self._thread = prometheus.start_http_server(port, addr=bind_address, registry=self.registry)
        self.port = self.server.server_port
        host = advertise or (bind_address if not is_wildcard(bind_address) else socket.getfqdn())
        host = f"[{host}]" if ":" in host else host  # an IPv6 literal in a URL or a file_sd target
        self.endpoint = f"http://{host}:{self.port}/metrics"
        self._address = f"{host}:{self.port}"
        self.series.info.labels(**labels).info(info)
        self._nvml = _Nvml(device, say) if device.type == "cuda" else None
        self._last_step = 0
        self._sample_device()

    def __call__(self, row: dict[str, Any]) -> None:
        """The trainer's log hook: every value here was synced by the trainer already."""
        series, labels = self.series, self.labels
        if row["kind"] == "eval":
            series.eval_loss.labels(**labels).set(row["test_loss"])
            series.eval_accuracy.labels(**labels).set(row["test_accuracy"])
            return
        series.samples_per_second.labels(**labels).set(row["rank_samples_per_second"])
        series.step_duration.labels(**labels).set(row["step_time_seconds"])
        series.loss.labels(**labels).set(row["loss"])
        series.accuracy.labels(**labels).set(row["accuracy"])
        series.learning_rate.labels(**labels).set(row["lr"])
        series.epoch.labels(**labels).set(row["epoch"])
        series.steps.labels(**labels).inc(max(0, row["step"] - self._last_step))
        series.samples.labels(**labels).inc(row["rank_samples"])
        series.heartbeat.labels(**labels).set(row["time"])
        if "slowest_rank" in row:  # DDP's reducer measured every rank's wait (lab.run.training.stragglers)
            series.slowest_rank.labels(**labels).set(row["slowest_rank"])
            series.slowest_rank_lag.labels(**labels).set(row["slowest_rank_lag_seconds"])
            series.communication_wait.labels(**labels).set(row["rank_wait_seconds"][int(labels["rank"])])
        self._last_step = row["step"]
        self._sample_device()

    def record_recovery(self, restarts: int, steps_redone: int) -> None:
        """What the run survived before this start (a new process after a restart: its counters start at 0)."""
        self.series.restarts.labels(**self.labels).inc(restarts)
        self.series.steps_redone.labels(**self.labels).inc(steps_redone)

    def record_hang(self, diagnosis: dict[str, Any]) -> None:
        """A hang this rank's watchdog named (from its thread): a series per rank, naming who waits where."""
        for r in diagnosis["ranks"]:
            collective = f"{r['op']} #{r['seq']}" if r.get("op") else ""
            self.series.hang.labels(
                **self.labels, hung_rank=str(r["rank"]), state=r["state"], collective=collective
            ).set(1)
        self.series.hang_time.labels(**self.labels).set(time.time())

    def _sample_device(self) -> None:
        import torch

        from lab.run.observability import device_memory

        series, labels = self.series, self.labels
        allocated, peak = device_memory.memory_bytes(self.device)
        series.memory_allocated.labels(**labels).set(allocated)
        series.memory_peak.labels(**labels).set(peak)
        cuda = self.device.type == "cuda"
        series.memory_reserved.labels(**labels).set(torch.cuda.memory_reserved(self.device) if cuda else allocated)
        if self._nvml:
            self._nvml.sample(series, labels)

    def target(self) -> dict[str, Any]:
        """This rank's entry of a Prometheus file_sd target file."""
        return {"targets": [self._address], "labels": dict(self.labels)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Nvml:
    """Per-GPU memory and utilisation from NVML (nvidia-ml-py), when it is there."""

    def __init__(self, device: torch.device, say: Callable[[str], None]) -> None:
        self.handle = None
        try:
            import pynvml

            from lab.run.cluster import nvml

            # By UUID: CUDA_VISIBLE_DEVICES may renumber the GPUs or name them by UUID (Slurm, Kubernetes, Docker).
            gpu = nvml.gpu_of(device.index if device.index is not None else 0)
            self.pynvml, self.handle, self.gpu = pynvml, gpu.handle, str(gpu.nvml_index)
        except Exception as exc:
            say(f"metrics: NVML not available ({type(exc).__name__}); per-GPU utilisation is not exported")

    def sample(self, series: Definitions, labels: dict[str, str]) -> None:
        if self.handle is None:
            return
        memory = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        utilization = self.pynvml.nvmlDeviceGetUtilizationRates(self.handle)
        gpu = {**labels, "gpu": self.gpu}
        series.gpu_used.labels(**gpu).set(memory.used)
        series.gpu_total.labels(**gpu).set(memory.total)
        series.gpu_utilization.labels(**gpu).set(utilization.gpu / 100)


class Listen(NamedTuple):
    bind: str  # the address the exporter listens on
    advertise: str  # the host its file_sd target names: where another host's Prometheus finds it
    reason: str  # why, when it is not metrics.bind_address as given ('' when it is)


def route_address(peer: str) -> str | None:
    """This host's address on its route to `peer` (a UDP connect picks the route and sends nothing)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(sockaddr)
            return probe.getsockname()[0]
    except (OSError, IndexError):
        return None


def listen_address(
    bind_address: str, multi_node: bool, head: str, route: Callable[[str], str | None] | None = None
) -> Listen:
    """Where a rank's exporter listens and the host its file_sd entry advertises.

    `head` is the host the workers rendezvous at (torchrun's MASTER_ADDR). On one node everything stays as
    configured: loopback by default, and a wildcard advertised by host name (compose resolves `lab`). On a
    multi-node run the targets must be reachable from another host's Prometheus:

    - a specific address (the launch role passes the node's, lab_node_address): listen and advertise there;
    - a wildcard: advertise the node's address, the one it reaches the head from;
    - loopback while the head is another host (a loopback exporter could only be scraped from its own node):
      listen on 0.0.0.0 and advertise the node's address. When the head itself is a loopback address, every
      "node" shares this host (the local two-node inventory) and loopback is right.

    The node's address falls back to this host's name when the route gives none, or only loopback (a head
    named by a host name that /etc/hosts maps to 127.0.1.1 on the head itself).
    """
    specific = not is_wildcard(bind_address) and not is_loopback(bind_address)
    all_on_this_host = is_loopback(bind_address) and is_loopback(head)
    if not multi_node or specific or all_on_this_host:
        return Listen(bind_address, "", "")

    def node_address() -> str:
        address = (route or route_address)(head)
        return address if address and not is_loopback(address) else socket.getfqdn()

    if is_wildcard(bind_address):
        return Listen(bind_address, node_address(), "")
    return Listen(
        "0.0.0.0",
        node_address(),
        f"metrics.bind_address={bind_address} cannot be scraped from the other nodes of this run",
    )


def start(
    cfg: MetricsConfig, ctx: DistContext, run_id: str, info: dict[str, str], say: Callable[[str], None] = print
) -> NullExporter:
    """This rank's exporter, or a null one when metrics are off or its port is taken (one warning)."""
    if cfg.port_base or cfg.pushgateway:
        _prometheus()  # now, not at the end of the run when the summary is pushed
    if not cfg.port_base:
        return NullExporter()
    port = cfg.port_base + ctx.local_rank
    labels = {"run_id": run_id, "rank": str(ctx.global_rank), "node": socket.gethostname()}
    multi_node = ctx.world_size > ctx.local_world_size
    bind = cfg.bind_address
    node = os.environ.get("LAB_NODE_ADDRESS")  # lab launch --local-addr: the node's own address (Slurm's NodeAddr)
    if multi_node and node and is_loopback(bind):  # loopback cannot be scraped from another node: the node's own can
        bind = node
    listen = listen_address(bind, multi_node=multi_node, head=torchrun_env.store_endpoint()[0])
    if listen.reason:
        say(f"metrics: {listen.reason}: the exporters listen on {listen.bind} and advertise {listen.advertise}")
    try:
        return RankExporter(port, listen.bind, labels, ctx.device, info, say, advertise=listen.advertise or None)
    except OSError as exc:
        print(
            f"warning: metrics: rank {ctx.global_rank} cannot serve on {listen.bind}:{port} ({exc.strerror}); "
            f"training goes on without its exporter",
            file=sys.stderr,
            flush=True,
        )
        return NullExporter()


def write_targets(path: Path, targets: list[dict[str, Any] | None]) -> Path | None:
    """A Prometheus file_sd file listing every rank's endpoint, written atomically."""
    entries = [t for t in targets if t]
    if not entries:
        return None
    # Prometheus never reads half a file, and its `*.json` glob never matches the temporary one
    atomic.write_text(path, json.dumps(entries, indent=2) + "\n")
    return path


# ----------------------------------------------------------------------------- Pushgateway


def push(gateway: str, job: str, grouping: dict[str, str], values: list[Sample], what: str) -> bool:
    """Push gauges (name, help, labels, value) under `grouping`, replacing the group (an HTTP PUT); an
    unreachable gateway costs one warning line, never the run."""
    prometheus = _prometheus()
    registry = prometheus.CollectorRegistry()
    families: dict[str, Gauge] = {}
    for name, doc, labels, value in values:
        if name not in families:
            families[name] = prometheus.Gauge(name, doc, list(labels), registry=registry)
        (families[name].labels(**labels) if labels else families[name]).set(value)
    try:
        prometheus.push_to_gateway(gateway, job=job, grouping_key=grouping, registry=registry, timeout=5)
        return True
    except Exception as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"warning: metrics: could not push {what} to the Pushgateway at {gateway} ({reason})",
            file=sys.stderr,
            flush=True,
        )
        return False


def push_run_summary(cfg: MetricsConfig, run_id: str, summary: dict[str, Any], ranks: list[dict[str, Any]]) -> bool:
    """Rank 0's push of the run's one group, (job, run_id), replacing what an earlier start of the run pushed:
    the run-wide figures once, without rank or node labels (a run spans nodes, and a figure with no rank
    label cannot be summed over ranks), and each rank's peak memory (`ranks`: rank, node,
    device_memory_peak_bytes, gathered from every rank) labelled by rank."""
    run_wide = [
        (
            "lab_run_samples_per_second",
            "Training images per second of the whole run (after warm-up)",
            summary.get("samples_per_second"),
        ),
        ("lab_run_final_loss", "Training loss at the last log interval", summary.get("final_loss")),
        ("lab_run_test_accuracy_ratio", "Test accuracy at the end", summary.get("test_accuracy")),
        ("lab_run_wall_time_seconds", "Wall time of the run", summary.get("wall_time_seconds")),
        ("lab_run_restarts", "Times torchrun restarted the run's worker group", summary.get("restart_count")),
        ("lab_run_steps_redone", "Optimizer steps run again after restarts", summary.get("steps_redone")),
    ]
    if summary.get("status") == "completed":
        run_wide.append(("lab_run_last_success_timestamp_seconds", "Unix time the run last completed", time.time()))
    # a figure the run did not reach (None) is left out, not pushed
    values: list[Sample] = [(name, doc, {}, value) for name, doc, value in run_wide if value is not None]
    values += [
        (
            "lab_run_device_memory_peak_bytes",
            "Peak memory of each rank (device, or process on CPU)",
            {"rank": str(r["rank"]), "node": r["node"]},
            r["device_memory_peak_bytes"],
        )
        for r in ranks
        if r["device_memory_peak_bytes"] is not None
    ]
    # in a workshop room the seat is part of the group: twenty seats' `run.id=baseline` are twenty groups
    return push(cfg.pushgateway, cfg.job, {"run_id": run_id, **seat.labels()}, values, "the run summary")


def run_info(ctx: DistContext, versions: dict[str, Any], data_source: str) -> dict[str, str]:
    """The labels of lab_run_info: versions and layout (constant for a run, so bounded)."""
    return {
        "lab_version": __version__,
        "world_size": str(ctx.world_size),
        "backend": ctx.backend or "none",
        "data_source": data_source,
        **{k: str(v) for k, v in versions.items() if v is not None},
    }


def push_allreduce(gateway: str, bench_id: str, rows: list[dict[str, Any]], dtype: str, op: str) -> bool:
    """Bus bandwidth per message size, out-of-place and in-place, in bytes/s (base units)."""
    doc = "All-reduce bus bandwidth (nccl-tests' busbw) by message size"
    values = [
        (
            "lab_allreduce_bus_bandwidth_bytes_per_second",
            doc,
            {"size_bytes": str(r["size"]), "placement": placement, "dtype": dtype, "op": op},
            r[key] * 1e9,
        )
        for r in rows
        for placement, key in (("out-of-place", "oop_busbw"), ("in-place", "ip_busbw"))
    ]
    return push(gateway, "lab-bench", {"run_id": bench_id}, values, "all-reduce results")


def push_scaling(gateway: str, bench_id: str, rows: list[dict[str, Any]], mode: str) -> bool:
    values = []
    for r in rows:
        labels = {"world_size": str(r["world_size"]), "mode": mode}
        values.append(
            (
                "lab_scaling_samples_per_second",
                "Training images per second at this world size",
                labels,
                r["samples_per_second"],
            )
        )
        values.append(("lab_scaling_efficiency_ratio", "thr_N / (N thr_1)", labels, r["efficiency"]))
    return push(gateway, "lab-bench", {"run_id": bench_id}, values, "scaling results")
