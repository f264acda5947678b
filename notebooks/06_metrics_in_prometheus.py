# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 6: the run in Prometheus
#
# Lecture 3 of the course, hands-on on a DGX, running at scale: a distributed run is many processes, and a slow or
# stuck one slows every other, because each step waits for the all-reduce. So each rank reports its own numbers, and
# one place collects them all: every rank serves a Prometheus `/metrics` page (images per second, step time, loss,
# memory) labelled with its `run_id`, `rank` and `node`; rank 0 writes a file_sd file listing every rank's address;
# Prometheus reads that file, scrapes each rank every few seconds and keeps the time series. The run's throughput is
# then a sum over ranks, and a straggler shows as one rank's line below the others.
#
# You will:
# 1. have a Prometheus ready: the stack's one under `docker compose` (`LAB_PROMETHEUS_URL`), otherwise one this
#    notebook starts from the `prometheus` binary with the lab's own `monitoring/prometheus.yml`;
# 2. train with the exporter on, every rank serving `/metrics`;
# 3. ask Prometheus over its HTTP API (`/api/v1/query`, `/api/v1/query_range`) what it holds: the series, the
#    throughput of each rank and of the whole run, and plot it.
#
# On a CPU this uses the `smoke` config (a narrow ResNet-18, width 8, on synthetic data) and 2 gloo processes; on a
# GPU server `workshop-gpu` and every GPU (NCCL). The training command is one you can type in the terminal.

# %%
import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from lab.course.teaching import lesson

folder = lesson.output_dir("06-metrics-in-prometheus")
plan = lesson.plan()  # with fewer than 2 GPUs, 2 CPU processes: one device per rank
gpu, n = plan.gpu, plan.ranks
print(plan.why)
run_id = f"lesson06-{time.strftime('%H%M%S')}"  # a new id each time: Prometheus keeps older runs' series
print(f"{n} processes, run id {run_id}, results in {folder}")


def query(expr: str, **params) -> list[dict]:
    """Prometheus' HTTP API: an instant query, or a range query when start/end/step are given."""
    api = "query_range" if "start" in params else "query"
    url = f"{prometheus_url}/api/v1/{api}?{urllib.parse.urlencode({'query': expr, **params})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body["status"] != "success":
        raise lesson.NotWhatYouShouldSee(f"Prometheus refused {expr}: {body}")
    return body["data"]["result"]


# %% [markdown]
# ## 1. A Prometheus that finds the run by itself
# The lab's `monitoring/prometheus.yml` has a `lab` job whose targets come from `targets/*.json` (file_sd): each
# run's rank 0 writes `<run id>.json` there (`--set metrics.targets_dir=...`), and Prometheus picks it up without a
# restart. Under `docker compose` that folder is the `targets` volume, and this notebook only queries the stack's
# Prometheus. Elsewhere the cell below starts one in a temporary folder with that same job and the lab's recording
# rules, changing only the intervals (half a second, so a short run gets many samples), the targets folder and the port.

# %%
prometheus_proc = None
if os.environ.get("LAB_PROMETHEUS_URL"):
    prometheus_url = os.environ["LAB_PROMETHEUS_URL"].rstrip("/")
    targets_dir = Path(os.environ.get("LAB_METRICS_TARGETS_DIR", "/lab/targets"))
    bind_address = "0.0.0.0"  # the stack's Prometheus is another container: it scrapes this one by host name
    print(f"the stack's Prometheus: {prometheus_url}; targets in {targets_dir}")
else:
    binary = shutil.which("prometheus")
    if binary is None:
        raise lesson.NotWhatYouShouldSee("no `prometheus` on PATH: install it (Debian: apt-get install prometheus, "
                                         "or scripts/install-test-tools.sh) or run this under docker compose")
    home = Path(tempfile.mkdtemp(prefix="lesson06-prometheus-"))
    targets_dir = home / "targets"
    targets_dir.mkdir()
    scrape = yaml.safe_load(lesson.checkout_file("monitoring/prometheus.yml").read_text())
    scrape["global"].update(scrape_interval="500ms", evaluation_interval="500ms")
    scrape["rule_files"] = [str(lesson.checkout_file("monitoring/rules/lab.rules.yml"))]
    lab_job = next(job for job in scrape["scrape_configs"] if job["job_name"] == "lab")
    lab_job["file_sd_configs"] = [{"files": [str(targets_dir / "*.json")], "refresh_interval": "500ms"}]
    scrape["scrape_configs"] = [lab_job]  # no Pushgateway, dcgm-exporter or node exporter here
    (home / "prometheus.yml").write_text(yaml.safe_dump(scrape))
    port = lesson.free_ports(1)
    prometheus_url = f"http://127.0.0.1:{port}"
    log = open(home / "prometheus.log", "w")
    prometheus_proc = subprocess.Popen(
        [binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    atexit.register(prometheus_proc.terminate)  # a safety net; the last cell stops it
    bind_address = "127.0.0.1"
    print(f"started {binary} at {prometheus_url} (its files in {home}); the lab job it runs:")
    print(yaml.safe_dump(lab_job, sort_keys=False))
deadline = time.time() + 30
while True:
    try:
        urllib.request.urlopen(f"{prometheus_url}/-/ready", timeout=1).close()
        break
    except OSError:
        if time.time() > deadline:
            raise lesson.NotWhatYouShouldSee(f"Prometheus at {prometheus_url} did not become ready in 30 s") from None
        time.sleep(0.2)
print("Prometheus is ready")

# %% [markdown]
# ## 2. A training run that exports its metrics
# `metrics.port_base=P` makes rank r serve `http://HOST:P+r/metrics`; `metrics.targets_dir` is where rank 0 writes
# the run's file_sd file (removed when the run ends); `train.log_every=1` updates the numbers every step, so a
# short run still gives Prometheus something to see. The run prints its endpoints at the start (`metrics: ...`).

# %%
# 128 steps on a CPU (2048 synthetic images, 4 epochs); the stack's Prometheus scrapes every 5 s and rereads its
# targets every 10 s, so under compose the run is 10 epochs (320 steps) to be seen for long enough
sizes = [] if gpu else ["--set", "model.width=8", "--set", "train.log_every=1",
                        "--set", "data.synthetic_train_size=2048",
                        "--set", f"train.epochs={10 if prometheus_proc is None else 4}"]
started = time.time()
lesson.lab("train", "--config", plan.config, "--nproc-per-node", str(n), *sizes,
           "--set", f"run.output_dir={folder}", "--set", f"run.id={run_id}",
           "--set", f"metrics.port_base={lesson.free_ports(n)}", "--set", f"metrics.bind_address={bind_address}",
           "--set", f"metrics.targets_dir={targets_dir}", "--set", "checkpoint.save=false")
ended = time.time()
print(f"the run took {ended - started:.0f} s")

# %% [markdown]
# ## 3. What Prometheus holds for the run
# Every series carries the run's labels, so `{run_id="..."}` selects all of them. `count by (__name__)` lists the
# metric names, with one series per rank each. The run is over and its targets are gone, but the samples stay:
# `last_over_time(...[10m])` reads the last one.

# %%
selector = f'{{run_id="{run_id}"}}'
deadline = time.time() + 20  # the last scrapes may still be arriving
while len(query(f"last_over_time(lab_train_samples_per_second{selector}[10m])")) < n and time.time() < deadline:
    time.sleep(0.5)
names = query(f"count by (__name__) (last_over_time({selector}[10m]))")
lesson.table(sorted(({"metric": r["metric"]["__name__"], "series": int(r["value"][1])} for r in names),
                    key=lambda r: r["metric"]), ["metric", "series"])

# %% [markdown]
# ## 4. Throughput per rank, and the run's
# `lab_train_samples_per_second` is each rank's own images/s. The recording rule
# `run_id:lab_train_samples_per_second:sum` (monitoring/rules/lab.rules.yml) sums it over ranks, every evaluation,
# while the run goes on: that is the run's throughput, the number a dashboard shows.

# %%
window = f"{selector}[10m]"
per_rank = {}
for what, expr in (("last", f"last_over_time(lab_train_samples_per_second{window})"),
                   ("max", f"max_over_time(lab_train_samples_per_second{window})"),
                   ("samples", f"count_over_time(lab_train_samples_per_second{window})"),
                   ("steps", f"last_over_time(lab_train_steps_total{window})")):
    for r in query(expr):
        row = per_rank.setdefault(r["metric"]["rank"], {"rank": r["metric"]["rank"], "node": r["metric"].get("node")})
        row[what] = float(r["value"][1])
lesson.table(sorted(per_rank.values(), key=lambda r: int(r["rank"])),
             ["rank", "node", "last", "max", "samples", "steps"])
run_total = query(f"max_over_time(run_id:lab_train_samples_per_second:sum{window})")
print("the run's throughput (the recording rule, its highest value):",
      ", ".join(f"{float(r['value'][1]):.0f} images/s" for r in run_total) or "nothing")

# %% [markdown]
# ## 5. The curves over the run
# `/api/v1/query_range` returns each series as (time, value) pairs between a start and an end, at a step. One line
# per rank, and the recording rule's sum above them.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

span = {"start": f"{started:.3f}", "end": f"{time.time():.3f}", "step": "1s" if prometheus_proc else "5s"}
ranges = query(f"lab_train_samples_per_second{selector}", **span)
summed = query(f"run_id:lab_train_samples_per_second:sum{selector}", **span)
fig, ax = plt.subplots(figsize=(8, 4))
for r in sorted(ranges, key=lambda r: int(r["metric"]["rank"])):
    t, v = zip(*[(float(ts) - started, float(x)) for ts, x in r["values"]])
    ax.plot(t, v, marker=".", label=f"rank {r['metric']['rank']} ({r['metric'].get('node')})")
for r in summed:
    t, v = zip(*[(float(ts) - started, float(x)) for ts, x in r["values"]])
    ax.plot(t, v, color="black", linestyle="--", label="sum over ranks (recording rule)")
ax.set_xlabel("seconds since the run started")
ax.set_ylabel("images per second")
ax.set_title(f"Run {run_id}: throughput per rank, as Prometheus scraped it")
ax.legend()
fig.tight_layout()
fig.savefig(folder / "throughput.png", dpi=100)
plt.close(fig)
lesson.show(folder / "throughput.png")

# %% [markdown]
# ## What you should see
# Every rank of the run (ranks 0 and 1 on a CPU) in Prometheus with nonzero images/s, found through the file_sd
# file alone, with `node` set to this machine's name; the two ranks' values close to each other (they wait for each
# other at every all-reduce); the recording rule's total at most the ranks' best values added up (the sum is taken
# at one instant, the maxima at different ones).
#
# **Ask:** why is the run's throughput a *sum* over ranks, while its step time is not?

# %%
try:
    ranks = sorted(per_rank, key=int)
    lesson.expect(ranks == [str(r) for r in range(n)],
                  f"every rank of the run is in Prometheus (ranks {', '.join(ranks) or 'none'} of {n})")
    lesson.expect(all(per_rank[r].get("max", 0) > 0 and per_rank[r].get("samples", 0) >= 2 for r in ranks),
                  "each rank has nonzero images/s, scraped at least twice ("
                  + ", ".join(f"rank {r}: {per_rank[r].get('max', 0):.0f}/s in "
                              f"{per_rank[r].get('samples', 0):.0f} samples" for r in ranks) + ")")
    best_sum = sum(per_rank[r].get("max", 0) for r in ranks)
    total = float(run_total[0]["value"][1]) if run_total else 0.0
    lesson.expect(len(run_total) == 1 and 0 < total <= best_sum * 1.000001,
                  f"the summed throughput (recording rule) returns a value, at most the ranks' best added up "
                  f"({total:.0f} <= {best_sum:.0f} images/s)")
    lesson.expect(all(per_rank[r].get("node") == socket.gethostname() for r in ranks),
                  f"every rank is labelled with this machine's name, node={socket.gethostname()}")
finally:
    if prometheus_proc is not None:  # the Prometheus this notebook started (not the stack's) stops here
        prometheus_proc.terminate()
        prometheus_proc.wait(timeout=20)
        print("stopped the notebook's Prometheus")
