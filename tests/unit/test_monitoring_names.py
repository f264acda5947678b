"""Every lab_* series that monitoring/ names is one the lab exports: a renamed metric cannot leave an alert, a
recording rule, a rule test or a dashboard panel on a name nothing serves (Prometheus would show no data, and an
alert on a dead name never fires).

The names defined are read from the exporter itself: the families a rank's registry holds
(lab.run.observability.metrics,
with Prometheus' suffixes by type) and the gauges the Pushgateway receives from the lab's pushes, caught by a local
HTTP server in the gateway's place. Recording rules define their own names (`record:`)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from lab.run import config
from lab.run.observability import metrics, room_metrics
from tests.conftest import ROOT

MONITORING = ROOT / "monitoring"
# What monitoring/ names series in; prometheus.yml names none (its lab_* words are file paths and job settings).
NAMING_FILES = sorted(
    [*MONITORING.glob("rules/*.yml"), *MONITORING.glob("grafana/dashboards/*.json"), *MONITORING.glob("tests/*.yml")]
)

# The samples Prometheus makes of a family, by type (client_python's exposition: counters add _total and _created,
# an info family is served as <name>_info).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "info": ("_info",),
    "gauge": ("",),
    "unknown": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}

# A PromQL or Prometheus text token: a metric or label name; recording rules put colons in theirs.
TOKEN = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")


def samples(families: Iterable[tuple[str, str]]) -> set[str]:
    """The series names of (family name, type) pairs."""
    return {name + suffix for name, kind in families for suffix in SUFFIXES[kind]}


def exported_by_a_rank() -> set[str]:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics.Definitions(registry, metrics._prometheus())  # the families RankExporter serves, in a private registry
    return samples((family.name, family.type) for family in registry.collect())


class _Gateway(BaseHTTPRequestHandler):
    """Takes every push (client_python PUTs the text exposition format) and answers as a Pushgateway does."""

    bodies: list[str] = []

    def do_PUT(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def pushed_by_the_lab() -> set[str]:
    """The series of every push the lab makes: a run's summary, all-reduce's and scaling's results, a room's."""
    from prometheus_client.parser import text_string_to_metric_families

    _Gateway.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    gateway = f"127.0.0.1:{server.server_port}"
    try:
        cfg = config.load("smoke", [f"metrics.pushgateway={gateway}"]).metrics
        summary = {
            "status": "completed",
            "samples_per_second": 1.0,
            "final_loss": 1.0,
            "test_accuracy": 0.5,
            "wall_time_seconds": 1.0,
            "restart_count": 0,
            "steps_redone": 0,
        }
        ranks = [{"rank": 0, "node": "n", "device_memory_peak_bytes": 1}]
        assert metrics.push_run_summary(cfg, "r1", summary, ranks)
        assert metrics.push_allreduce(gateway, "b1", [{"size": 8, "oop_busbw": 1.0, "ip_busbw": 1.0}], "float", "sum")
        assert metrics.push_scaling(
            gateway, "s1", [{"world_size": 1, "samples_per_second": 1.0, "efficiency": 1.0}], "weak"
        )
        # a workshop room's: a lesson's checks, each lesson's count, each seat's GPUs
        assert room_metrics.push_lesson_checks(gateway, "01", 1, 0)
        assert room_metrics.push_room_lessons(gateway, [("01", 1)])
        assert room_metrics.push_room_seats(gateway, [("seat1", ["0"])])
        assert room_metrics.push_exercise(gateway, "convert", 9, 1, "a new order each epoch")  # an exercise's grading
    finally:
        server.shutdown()
        server.server_close()
    return samples(
        (family.name, family.type) for body in _Gateway.bodies for family in text_string_to_metric_families(body)
    )


def recorded(rule_files: Iterable[Path]) -> set[str]:
    """The names the recording rules define."""
    return {
        rule["record"]
        for path in rule_files
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def _strings(value) -> Iterator[str]:
    """Every string in a loaded YAML or JSON document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def named_series(text: str) -> set[str]:
    """The lab's series a PromQL expression or series selector names: lab_* names, and recording-rule names
    (level:metric:operations) built on one."""
    return {token for token in TOKEN.findall(text) if any(part.startswith("lab_") for part in token.split(":"))}


def named_in(path: Path) -> set[str]:
    document = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    return {name for text in _strings(document) for name in named_series(text)}


@pytest.fixture(scope="module")
def defined() -> set[str]:
    return exported_by_a_rank() | pushed_by_the_lab() | recorded(MONITORING.glob("rules/*.yml"))


def test_the_exporter_is_read_with_prometheus_suffixes(defined):
    # Counters are served with _total (what the alerts query), info families with _info, pushes as gauges.
    assert {
        "lab_train_steps_total",
        "lab_train_steps_created",
        "lab_run_info",
        "lab_train_samples_per_second",
        "lab_allreduce_bus_bandwidth_bytes_per_second",
        "lab_run_final_loss",
    } <= defined
    assert "lab_train_steps" not in defined and "lab_run" not in defined
    assert "run_id:lab_train_samples_per_second:sum" in defined  # a recording rule's own name


@pytest.mark.parametrize("path", NAMING_FILES, ids=lambda p: str(p.relative_to(MONITORING)))
def test_every_series_monitoring_names_is_defined(path, defined):
    names = named_in(path)
    assert names, f"{path}: no lab_* series found; has the file moved or its format changed?"
    undefined = sorted(names - defined)
    assert not undefined, (
        f"{path.relative_to(ROOT)} names {undefined}, which lab/run/observability/metrics.py does not "
        f"export and no recording rule defines"
    )


def test_the_monitoring_files_are_all_read():
    kinds = {path.relative_to(MONITORING).parts[0] for path in NAMING_FILES}
    assert kinds == {"rules", "grafana", "tests"}, NAMING_FILES


@pytest.mark.parametrize(
    "expression, dead",
    [
        ("sum by (run_id) (lab_train_samples_per_secnd)", "lab_train_samples_per_secnd"),  # a typo
        ("increase(lab_train_steps[2m]) == 0", "lab_train_steps"),  # _total forgotten
        ("run_id:lab_train_samples_per_second:summ < 0.7", "run_id:lab_train_samples_per_second:summ"),  # a rule's name
        ('lab_train_step_duration{run_id="r1"}', "lab_train_step_duration"),  # unit dropped
    ],
)
def test_a_misspelt_name_is_caught(expression, dead, defined):
    assert named_series(expression) - defined == {dead}


def test_a_misspelt_name_in_a_copy_of_the_rules_is_caught(tmp_path, defined):
    rules = (MONITORING / "rules" / "lab.rules.yml").read_text()
    assert "lab_train_steps_total" in rules
    (tmp_path / "lab.rules.yml").write_text(rules.replace("lab_train_steps_total", "lab_train_step_total"))
    assert named_in(tmp_path / "lab.rules.yml") - defined == {"lab_train_step_total"}


def test_words_that_are_not_the_labs_series_are_not_read_as_such():
    # Label names and values, other exporters' series, file names and template variables are not the lab's.
    text = (
        'up{job="lab"} == 0 and DCGM_FI_DEV_XID_ERRORS > 0 {{ $labels.run_id }} ../rules/lab.rules.yml '
        "label_values(lab_run_info, run_id) $lab_var"
    )
    assert named_series(text) == {"lab_run_info"}
