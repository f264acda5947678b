"""A real Prometheus and Pushgateway on 127.0.0.1, a real 2-rank training run, queries over HTTP.

Prometheus runs the shipped monitoring/prometheus.yml and rules with only what a test
must change: its ports, a 1 s scrape interval and where the file_sd targets live.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from lab.course.teaching.lesson import free_ports
from tests.conftest import PYTHON, ROOT, TINY, lab

MONITORING = ROOT / "monitoring"
PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")


def _require(binary: str | None, name: str) -> str:
    if binary:
        return binary
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not installed; `make test` installs it (scripts/install-test-tools.sh)")
    pytest.skip(f"{name} is not installed (scripts/install-test-tools.sh installs it as root with apt-get)")


def _wait_http(url: str, seconds: float = 20) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


@pytest.fixture
def stack(tmp_path):
    """Prometheus + Pushgateway, started for the test and stopped after it."""
    prometheus = _require(shutil.which("prometheus"), "prometheus")
    pushgateway = _require(PUSHGATEWAY, "prometheus-pushgateway")
    prom_port, push_port = free_ports(), free_ports()
    targets = tmp_path / "targets"
    targets.mkdir()
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(MONITORING / "rules" / "*.rules.yml")]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    jobs["lab"]["file_sd_configs"] = [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}]
    jobs["pushgateway"]["static_configs"] = [{"targets": [f"127.0.0.1:{push_port}"]}]
    config["scrape_configs"] = [jobs["lab"], jobs["pushgateway"]]  # no dcgm/node exporters on this machine
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    procs = [
        # Debian's build persists to /var/lib/prometheus/pushgateway.data by default: every test run would see
        # the groups of the runs before it (a stale run "promtest" failed a clean-clone run here). A fresh file.
        subprocess.Popen(
            [
                pushgateway,
                f"--web.listen-address=127.0.0.1:{push_port}",
                f"--persistence.file={tmp_path / 'pushgateway.data'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        _wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        _wait_http(f"http://127.0.0.1:{push_port}/metrics")
        yield {
            "prometheus": f"http://127.0.0.1:{prom_port}",
            "pushgateway": f"127.0.0.1:{push_port}",
            "targets": targets,
        }
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(base: str, expr: str, count: int, seconds: float = 30) -> list[dict]:
    deadline = time.time() + seconds
    while True:
        result = query(base, expr)
        if len(result) >= count or time.time() > deadline:
            return result
        time.sleep(0.5)


def test_two_rank_run_is_scraped_summed_and_its_summary_outlives_it(stack, tmp_path):
    port_base = free_ports(2)
    run_id = "promtest"
    args = [
        PYTHON,
        "-m",
        "lab",
        "train",
        *TINY,
        "--nproc-per-node",
        "2",
        "--set",
        f"run.output_dir={tmp_path}/runs",
        "--set",
        f"run.id={run_id}",
        "--set",
        "train.epochs=20",
        "--set",
        "train.log_every=1",
        "--set",
        f"metrics.port_base={port_base}",
        "--set",
        f"metrics.targets_dir={stack['targets']}",
        "--set",
        f"metrics.pushgateway={stack['pushgateway']}",
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    endpoints = [f"http://127.0.0.1:{port_base + r}/metrics" for r in range(2)]
    for url in endpoints:
        _wait_http(url, 120)
    scrape_text = urllib.request.urlopen(endpoints[1], timeout=5).read().decode()

    # 50 concurrent scrapes while training runs: every one answers.
    def scrape(i: int) -> int:
        with urllib.request.urlopen(endpoints[i % 2], timeout=10) as response:
            return response.status

    with ThreadPoolExecutor(max_workers=50) as pool:
        statuses = list(pool.map(scrape, range(50)))
    assert statuses == [200] * 50

    # While the run goes on, Prometheus finds both ranks through the file_sd file and scrapes them.
    live = wait_for(stack["prometheus"], f'last_over_time(lab_train_samples_per_second{{run_id="{run_id}"}}[10m])', 2)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"metrics: {endpoints[0]}, {endpoints[1]}" in stdout  # the endpoints are printed at start
    assert {r["metric"]["rank"] for r in live} == {"0", "1"}
    assert all(r["metric"]["node"] == socket.gethostname() and r["metric"]["job"] == "lab" for r in live)

    prom = stack["prometheus"]
    window = f'{{run_id="{run_id}"}}[10m]'
    per_rank = query(prom, f"last_over_time(lab_train_samples_per_second{window})")
    memory = query(prom, f"last_over_time(lab_device_memory_allocated_bytes{window})")
    peak = query(prom, f"last_over_time(lab_device_memory_peak_bytes{window})")
    assert {r["metric"]["rank"] for r in per_rank} == {r["metric"]["rank"] for r in memory} == {"0", "1"}
    assert all(float(r["value"][1]) > 1e6 for r in memory + peak)  # resident bytes of a torch process
    # The recording rule's run total: the sum over ranks, so never above the ranks' best values added up.
    total = query(prom, f"max_over_time(run_id:lab_train_samples_per_second:sum{window})")
    best = query(prom, f"max_over_time(lab_train_samples_per_second{window})")
    assert len(total) == 1, "the recording rule produced nothing"
    assert 0 < float(total[0]["value"][1]) <= sum(float(r["value"][1]) for r in best) * 1.000001
    steps = query(prom, f"last_over_time(lab_train_steps_total{window})")
    assert all(1 <= float(r["value"][1]) <= 160 for r in steps)  # 20 epochs x 8 steps

    # The run is over and its targets are gone; the pushed summary is still there.
    assert not (stack["targets"] / f"{run_id}.json").exists()
    assert (tmp_path / "runs" / run_id / "prometheus-targets.json").exists()
    # The run's throughput from the Pushgateway: one series, rank 0's push of the run figure, without a rank
    # label, equal to summary.json's; a sum over ranks reads the same, not twice the truth.
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    pushed = wait_for(prom, f'lab_run_samples_per_second{{run_id="{run_id}"}}', 1)
    assert len(pushed) == 1 and "rank" not in pushed[0]["metric"] and pushed[0]["metric"]["job"] == "lab", pushed
    assert float(pushed[0]["value"][1]) == pytest.approx(summary["samples_per_second"])
    summed = query(prom, f'sum by (run_id) (lab_run_samples_per_second{{run_id="{run_id}"}})')
    assert float(summed[0]["value"][1]) == pytest.approx(summary["samples_per_second"])
    # The one per-rank figure of the summary, labelled by rank, in the same group
    peaks = wait_for(prom, f'lab_run_device_memory_peak_bytes{{run_id="{run_id}"}}', 2)
    assert sorted(r["metric"]["rank"] for r in peaks) == ["0", "1"] and all(float(r["value"][1]) > 1e6 for r in peaks)
    success = wait_for(prom, f'lab_run_last_success_timestamp_seconds{{run_id="{run_id}"}}', 1)
    assert len(success) == 1 and abs(float(success[0]["value"][1]) - time.time()) < 600
    # One group for the run in the Pushgateway: (job, run_id), no group per rank to go stale
    assert _groups(stack["pushgateway"], run_id) == [{"job": "lab", "run_id": run_id}]

    # promtool's naming lint on a real scrape: no complaints.
    promtool = shutil.which("promtool")
    check = subprocess.run([promtool, "check", "metrics"], input=scrape_text, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check.stdout + check.stderr
    assert "lab_run_info{" in scrape_text and f'run_id="{run_id}"' in scrape_text


def _groups(pushgateway: str, *run_ids: str) -> list[dict[str, str]]:
    """The Pushgateway's groups of these runs (its /api/v1/metrics), each as its grouping labels."""
    with urllib.request.urlopen(f"http://{pushgateway}/api/v1/metrics", timeout=10) as response:
        groups = [group["labels"] for group in json.load(response)["data"]]
    return sorted((g for g in groups if g.get("run_id") in run_ids), key=lambda g: sorted(g.items()))


def test_a_run_that_ends_again_replaces_its_group(stack):
    """A restarted run (same run id) pushes again: its group is replaced, not added to, whatever the world size
    of the earlier start; another run keeps its own group."""
    from lab.run import config
    from lab.run.observability import metrics

    cfg = config.load("smoke", [f"metrics.pushgateway={stack['pushgateway']}"]).metrics
    summary = {"status": "completed", "samples_per_second": 100.0, "wall_time_seconds": 10.0}
    four = [{"rank": r, "node": f"n{r // 2}", "device_memory_peak_bytes": 1e9} for r in range(4)]
    assert metrics.push_run_summary(cfg, "r1", summary, four)
    assert metrics.push_run_summary(cfg, "r1", {**summary, "samples_per_second": 60.0}, four[:2])
    assert metrics.push_run_summary(cfg, "r2", summary, four[:1])
    assert _groups(stack["pushgateway"], "r1", "r2") == [{"job": "lab", "run_id": "r1"}, {"job": "lab", "run_id": "r2"}]
    prom = stack["prometheus"]
    rate = wait_for(prom, 'lab_run_samples_per_second{run_id="r1"} == 60', 1)
    assert len(query(prom, 'lab_run_samples_per_second{run_id="r1"}')) == 1, rate
    assert len(wait_for(prom, 'lab_run_device_memory_peak_bytes{run_id="r1"}', 2)) == 2  # ranks 2, 3 are gone


def test_two_seats_runs_stay_apart_by_seat_and_the_room_dashboard_reads_their_lessons_and_exercises(stack, tmp_path):
    """A workshop room: two seats train a run of the same id at once (their lessons give every seat the same
    ids). Each seat's targets file, series and pushed summary carry its seat, so neither overwrites the other;
    the lessons' pushed checks and the room's pushed check counts give the room dashboard's seats-by-lesson cell."""
    port_base = free_ports(2)
    procs = {}
    for offset, name in enumerate(("seat1", "seat2")):
        args = [
            PYTHON,
            "-m",
            "lab",
            "train",
            *TINY,
            "--set",
            f"run.output_dir={tmp_path}/{name}",
            "--set",
            "run.id=baseline",
            "--set",
            "train.epochs=8",
            "--set",
            "train.log_every=1",
            "--set",
            f"metrics.port_base={port_base + offset}",
            "--set",
            f"metrics.targets_dir={stack['targets']}",
            "--set",
            f"metrics.pushgateway={stack['pushgateway']}",
        ]
        procs[name] = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "LAB_SEAT": name, "OMP_NUM_THREADS": "1"},
        )
    prom = stack["prometheus"]
    live = wait_for(prom, 'last_over_time(lab_train_steps_total{run_id="baseline"}[10m])', 2, seconds=120)
    for name, proc in procs.items():
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        assert not (stack["targets"] / f"{name}-baseline.json").exists()  # withdrawn at the end, by its seat's name
        targets = json.loads((tmp_path / name / "baseline" / "prometheus-targets.json").read_text())
        assert targets[0]["labels"]["seat"] == name
    assert sorted(r["metric"]["seat"] for r in live) == ["seat1", "seat2"]
    assert _groups(stack["pushgateway"], "baseline") == [
        {"job": "lab", "run_id": "baseline", "seat": "seat1"},
        {"job": "lab", "run_id": "baseline", "seat": "seat2"},
    ]

    # the lessons' checks (pushed as they are recorded) and each lesson's count (pushed by lab room serve)
    from lab.course import records
    from lab.run.observability import room_metrics
    from lab.verdict import FAILED, HELD, Check

    assert room_metrics.push_room_lessons(stack["pushgateway"], [("01", 2), ("02", 1)])
    assert room_metrics.push_room_seats(stack["pushgateway"], [("seat1", ["0", "1"]), ("seat2", ["2", "3"])])
    for name, checks in (("seat1", [True, True]), ("seat2", [True]), ("seat3", [False])):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("LAB_SEAT", name)
            env.setenv(records.PUSHGATEWAY_ENV, stack["pushgateway"])
            folder = tmp_path / name / "01-baseline-and-ddp"
            folder.mkdir(parents=True, exist_ok=True)
            records.begin(folder, "01-baseline-and-ddp")
            for held in checks:
                records.append(folder, Check("a check", HELD if held else FAILED, ""))
    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "room.json").read_text())
    cell = dashboard["panels"][0]["targets"][0]["expr"]
    shown = {r["metric"]["seat"]: float(r["value"][1]) for r in wait_for(prom, cell, 3)}
    assert shown == {"seat1": 1.0, "seat2": 0.5, "seat3": -1.0}  # passed, running (1 of 2), failed

    # the exercises' gradings, pushed as lab exercise check records them: held, failed (naming the check), not run
    for name, held in (("seat1", True), ("seat2", False)):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("LAB_SEAT", name)
            env.setenv(records.PUSHGATEWAY_ENV, stack["pushgateway"])
            env.setenv(records.LESSON_RUNS_ENV, str(tmp_path / name))
            graded = [Check("runs on 2 ranks", HELD, ""), Check("a new order", HELD if held else FAILED, "")]
            records.write("convert", graded, 0.0)
    by_exercise = next(p for p in dashboard["panels"] if p["title"] == "Seats by exercise")["targets"][0]["expr"]
    shown = {
        (r["metric"]["seat"], r["metric"]["exercise"]): float(r["value"][1]) for r in wait_for(prom, by_exercise, 2)
    }
    assert shown == {("seat1", "convert"): 1.0, ("seat2", "convert"): -1.0}
    stuck = wait_for(prom, "lab_exercise_failing_check_info", 1)
    assert [(r["metric"]["seat"], r["metric"]["check"]) for r in stuck] == [("seat2", "a new order")]
    gpus = wait_for(prom, "lab_room_seat_gpu_info", 4)
    assert sorted((r["metric"]["seat"], r["metric"]["gpu"]) for r in gpus) == [
        ("seat1", "0"),
        ("seat1", "1"),
        ("seat2", "2"),
        ("seat2", "3"),
    ]


def test_the_room_dashboard_uses_the_lab_metrics():
    from lab.run.observability import metrics

    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "room.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    source = "".join(p.read_text() for p in Path(metrics.__file__).parent.glob("*.py"))
    for name in set(re.findall(r"\blab_[a-z_]+\b", exprs)):
        assert f'"{name.removesuffix("_total")}"' in source, f"{name} is not defined in lab/run/observability/"
    assert "DCGM_FI_DEV_FB_USED" in exprs and "lab_room_seat_gpu_info" in exprs


def test_an_unreachable_pushgateway_costs_one_warning_line(tmp_path):
    dead = free_ports()
    proc = lab(
        "train",
        *TINY,
        "--set",
        "train.max_steps=2",
        "--set",
        f"run.output_dir={tmp_path}",
        "--set",
        f"metrics.pushgateway=127.0.0.1:{dead}",
        "--nproc-per-node",
        "2",
    )
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: metrics:")]
    assert len(warnings) == 1 and "could not push the run summary" in warnings[0], proc.stderr


def test_a_taken_port_costs_one_warning_and_training_goes_on(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = lab(
            "train",
            *TINY,
            "--set",
            "train.max_steps=2",
            "--set",
            f"run.output_dir={tmp_path}",
            "--set",
            f"metrics.port_base={port}",
        )
    assert "warning: metrics: rank 0 cannot serve on 127.0.0.1" in proc.stderr
    assert json.loads(next(Path(tmp_path).glob("*/summary.json")).read_text())["status"] == "completed"


def test_promtool_accepts_the_shipped_config_and_rules():
    promtool = _require(shutil.which("promtool"), "promtool")
    for args in (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "rules/lab.rules.yml"],
        ["test", "rules", "tests/lab.rules.test.yml"],
    ):
        proc = subprocess.run([promtool, *args], cwd=MONITORING, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout + proc.stderr


def test_metrics_overhead_benchmark_prints_an_interleaved_ratio(tmp_path):
    proc = lab(
        "bench",
        "metrics-overhead",
        "--set",
        "model.width=8",
        "--set",
        "train.log_every=2",
        "--rounds",
        "2",
        "--steps",
        "8",
        "--scrape-interval",
        "0.2",
        "--json",
        str(tmp_path / "o.json"),
    )
    result = json.loads((tmp_path / "o.json").read_text())
    assert len(result["block_seconds_on"]) == len(result["block_seconds_off"]) == 2
    assert result["ratio_on_over_off"] == pytest.approx(
        sum(result["block_seconds_on"]) / sum(result["block_seconds_off"])
    )
    assert result["scrapes"] > 0 and result["scrape_failures"] == 0  # the exporter really was scraped
    assert "exporter on / off:" in proc.stdout


def test_dashboard_uses_the_lab_metrics_and_a_run_variable():
    from lab.run.observability import metrics

    dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "lab.json").read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["run_id", "node"]
    # the GPU panels show the selected runs' nodes: the node variable is the ranks' node label
    nodes = dashboard["templating"]["list"][1]
    assert nodes["definition"] == 'label_values(lab_run_info{run_id=~"$run_id"}, node)'
    gpu_exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"] if "DCGM_" in t["expr"]]
    assert gpu_exprs and all('{node=~"$node"}' in e for e in gpu_exprs), gpu_exprs
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    source = "".join(p.read_text() for p in Path(metrics.__file__).parent.glob("*.py"))
    for name in set(re.findall(r"\blab_[a-z_]+\b", exprs)):
        base = name.removesuffix("_total")
        assert f'"{base}"' in source, f"{name} in the dashboard is not defined in lab/run/observability/"
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_UTIL",
        "run_id:lab_train_samples_per_second:sum",
        "lab_allreduce_bus_bandwidth_bytes_per_second",
        "lab_device_memory_allocated_bytes",
    ):
        assert name in exprs
