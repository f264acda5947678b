"""The lab under a real two-node Slurm cluster on this host (tests/infra/slurm_cluster.py): slurm/lab.sbatch
submitted with sbatch as an operator types it, a rank killed, a job requeued mid-run, `srun -n2` one task per
rank, pyxis's options, the fabric check as a Slurm job, and each node's exporters found by a real Prometheus.

Both "nodes" are this host (127.0.0.1 and 127.0.0.2), so gloo is told to use loopback (GLOO_SOCKET_IFNAME=lo), as
an operator sets NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME for a cluster's network.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from lab.course.teaching.lesson import free_ports
from tests.conftest import PYTHON, ROOT
from tests.infra.slurm_cluster import SlurmCluster

LAB = str(Path(PYTHON).parent / "lab")  # the lab "installed on the nodes": this venv's entry point
# The smoke config at width 8 for 25 epochs (200 steps, about 10 s), a checkpoint every 4: long enough to requeue
# mid-run, and for Prometheus to scrape the reference job's exporters (its scrape manager takes in new targets at
# most every 5 s: a 3-second run once ended unseen).
TRAINING = {"LAB_SET": "model.width=8 train.epochs=25 run.deterministic=true", "LAB_CHECKPOINT_EVERY": "4"}


def _job_env(runs: Path, **extra: str) -> dict[str, str]:
    # A free rendezvous port per job, not the script's default 29400: another torchrun on this machine (a
    # developer's run beside the suite) would otherwise be joined or refused by it.
    return {
        "LAB_COMMAND": LAB,
        "LAB_RUNS": str(runs),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "LAB_RDZV_PORT": str(free_ports()),
        **TRAINING,
        **extra,
    }


def _output(folder: Path, job_id: str) -> str:
    return next(folder.glob(f"slurm-*-{job_id}.out")).read_text()


def _run_dirs(runs: Path) -> list[Path]:
    return [d for d in runs.iterdir() if d.is_dir() and d.name.startswith("slurm-")]


def _losses(run_dir: Path) -> dict[int, float]:
    """step -> loss, the last logged value of each step (a resumed run logs the redone steps again)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def _processes_of(job_id: str, rank: str) -> list[int]:
    """PIDs of the job's torchrun worker with global rank `rank`, from /proc (the test sees every namespace)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except OSError:
            continue
        torchrun_worker = "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env  # not a task with enroot's hook
        if env.get("SLURM_JOB_ID") == job_id and env.get("RANK") == rank and torchrun_worker:
            found.append(int(entry.name))
    return found


def _wait_for_step(run_dirs: Path, step: int, cluster: SlurmCluster, job_id: str, timeout_s: float = 180) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run_dir in _run_dirs(run_dirs) if run_dirs.exists() else []:
            if (run_dir / "metrics.jsonl").exists() and max(_losses(run_dir), default=0) >= step:
                return run_dir
        state = cluster.job(job_id).state
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job_id} {state} before step {step}"
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} reached no step {step} within {timeout_s:g} s")


# ----------------------------------------------------------------------------- Prometheus


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus reading the shipped config's lab job through file_sd from a folder the job shares."""
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed; `make test` installs it (scripts/install-test-tools.sh)")
        pytest.skip("prometheus is not installed (scripts/install-test-tools.sh)")
    tmp_path = tmp_path_factory.mktemp("prometheus")
    targets, port = tmp_path / "targets", free_ports()
    targets.mkdir()
    config = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    # a scrape every 0.25 s: file_sd sees a new target file at once (inotify), so both nodes' exporters are
    # scraped within the seconds the reference job trains
    config["global"].update(scrape_interval="250ms", scrape_timeout="250ms", evaluation_interval="1s")
    config.pop("rule_files", None)
    lab_job = next(job for job in config["scrape_configs"] if job["job_name"] == "lab")
    lab_job.pop("scrape_interval", None)
    lab_job.pop("scrape_timeout", None)
    lab_job["file_sd_configs"] = [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}]
    config["scrape_configs"] = [lab_job]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield {"url": base, "targets": targets}
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _query(base: str, expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        return json.load(r)["data"]["result"]


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def reference(cluster, prometheus, tmp_path_factory):
    """One uninterrupted job of the shipped script, as typed in docs/slurm.md (sbatch -N 2 slurm/lab.sbatch), its
    ranks' exporters announced to a real Prometheus through the shared targets folder: (folder, job, the exporters
    Prometheus scraped while it ran, labelled with the job's id)."""
    folder = tmp_path_factory.mktemp("reference")
    port = free_ports()
    started = time.monotonic()
    env = _job_env(folder / "runs", LAB_METRICS_PORT_BASE=str(port), LAB_TARGETS_DIR=str(prometheus["targets"]))
    job_id = cluster.sbatch("sbatch -N 2 slurm/lab.sbatch", ROOT, folder, env=env)
    seen: set[str] = set()
    while cluster.job(job_id).state in ("PENDING", "CONFIGURING", "RUNNING") and len(seen) < 2:
        seen |= {r["metric"]["instance"] for r in _query(prometheus["url"], f'up{{slurm_job_id="{job_id}"}} == 1')}
        time.sleep(0.2)
    job = cluster.wait(job_id)
    print(f"sbatch -N 2 slurm/lab.sbatch: {job.state} in {time.monotonic() - started:.1f} s")
    return folder, job, {"seen": seen, "port": port}


def test_sbatch_of_the_shipped_script_trains_on_both_nodes_with_one_run_directory(reference):
    folder, job, _ = reference
    out = _output(folder, job.job_id)
    assert job.state == "COMPLETED" and job.rc == 0, out[-3000:]
    [run_dir] = _run_dirs(folder / "runs")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["slurm"]["job_id"] == job.job_id
    assert manifest["slurm"]["nodes"] == ["n1", "n2"]
    assert sorted((r["slurm_node"], r["node_rank"]) for r in manifest["ranks"]) == [("n1", 0), ("n2", 1)]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert (run_dir / "report.md").exists() and f"job {job.job_id} completed" in out
    # the run id is the job's and a time stamp: a fresh cluster's job 1 never resumes an older job 1's checkpoint
    assert run_dir.name.startswith(f"slurm-{job.job_id}-")


def test_a_killed_rank_fails_the_job_with_its_exit_code_and_the_labs_one_line_reason(cluster, tmp_path):
    job_id = cluster.sbatch(
        "sbatch -N 2 slurm/lab.sbatch", ROOT, tmp_path, env=_job_env(tmp_path / "runs", LAB_MAX_RESTARTS="0")
    )
    _wait_for_step(tmp_path / "runs", 2, cluster, job_id)
    for pid in _processes_of(job_id, rank="1"):
        os.kill(pid, signal.SIGKILL)
    job = cluster.wait(job_id)
    out = _output(tmp_path, job_id)
    # srun's status is its tasks' highest: the failed node's 1, or 143 for the node it then stopped (SIGTERM)
    assert job.state == "FAILED" and job.rc in (1, 143), (job, out[-3000:])
    assert f"job {job_id} failed: the training step exited {job.rc}" in out, out[-3000:]
    assert (
        "lab launch: this node's workers (127.0.0.2) failed, torchrun exit 1: rank 1 (local_rank: 0): "
        "Signal 9 (SIGKILL) received by PID"
    ) in out, out[-3000:]


# pyxis and enroot cannot be installed here. This stand-in `srun`, first on PATH, behaves as they do where it
# matters to the scripts: it writes down the --container-* options and drops them; a task "in the image" gets the
# variables enroot's PyTorch hook (50-slurm-pytorch.sh, on where the image sets PYTORCH_VERSION, as NGC's do)
# exports from SLURM_* into every task, torchrun or not; and the image's entry point is not run (pyxis runs it
# only with --container-entrypoint): the scripts must call it themselves.
PYXIS_STAND_IN = """#!/usr/bin/env bash
args=() image=""
for a in "$@"; do
  case $a in
    --container-image=*) image=1; echo "$a" >> "$PYXIS_LOG" ;;
    --container-*|--no-container-*) echo "$a" >> "$PYXIS_LOG" ;;
    *) args+=("$a") ;;
  esac
done
[[ -n $image ]] || exec /usr/bin/srun "${args[@]}"
options=()  # srun's own options (the scripts write each as --name=value), then the task's command
while [[ ${#args[@]} -gt 0 && ${args[0]} == -* ]]; do options+=("${args[0]}"); args=("${args[@]:1}"); done
exec /usr/bin/srun "${options[@]}" bash -c 'export PYTORCH_VERSION=2.6 RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \
  WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=${SLURM_JOB_NODELIST%%,*} MASTER_PORT=29500; exec "$@"' enroot-hook "${args[@]}"
"""


def _pyxis(tmp_path: Path) -> dict[str, str]:
    """The stand-in's environment: srun first on PATH, the image's entry point (this checkout's, whose NGC part is a
    stand-in that writes down each node that ran it) and where both write."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "srun").write_text(PYXIS_STAND_IN)
    (shim / "srun").chmod(0o755)
    ngc = shim / "nvidia_entrypoint.sh"
    ngc.write_text('#!/usr/bin/env bash\necho "$SLURMD_NODENAME" >> "$NGC_LOG"\nexec "$@"\n')
    return {
        "LAB_IMAGE": "nvcr.io#lab/lab:test",
        "LAB_ENTRYPOINT": str(ROOT / "images" / "entrypoint.sh"),
        "LAB_NGC_ENTRYPOINT": str(ngc),
        "PYXIS_LOG": str(tmp_path / "pyxis.log"),
        "NGC_LOG": str(tmp_path / "ngc.log"),
        "PATH": f"{shim}:{os.environ['PATH']}",
    }


def test_a_requeued_job_resumes_from_the_shared_checkpoint_and_its_curve_equals_an_uninterrupted_one(
    cluster, reference, tmp_path
):
    """In "the image", through the pyxis stand-in: the job launches although enroot's hook exported RANK,
    LOCAL_RANK and WORLD_SIZE into its tasks, calls the image's entry point on every node, and keeps one named
    container for the job."""
    env = _job_env(tmp_path / "runs", **_pyxis(tmp_path))
    job_id = cluster.sbatch("sbatch -N 2 slurm/lab.sbatch", ROOT, tmp_path, env=env)
    run_dir = _wait_for_step(tmp_path / "runs", 6, cluster, job_id)  # past the checkpoint at step 4
    cluster.scontrol("requeue", job_id)
    # Slurm keeps a requeued job from starting for about two minutes (BeginTime); an operator's shortcut too:
    cluster.wait(job_id, until=("PENDING",))
    cluster.scontrol("update", f"JobId={job_id}", "StartTime=now")
    job = cluster.wait(job_id, timeout_s=300)
    out = _output(tmp_path, job_id)
    assert job.state == "COMPLETED", out[-3000:]
    assert job.fields["Restarts"] == "1" and _run_dirs(tmp_path / "runs") == [run_dir]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [s["step"] % 4 for s in manifest["starts"]] == [0, 0] and manifest["starts"][1]["resumed_from"]
    [reference_run] = _run_dirs(reference[0] / "runs")
    assert _losses(run_dir) == _losses(reference_run)  # bit-identical: the curve of a job never interrupted
    pyxis = (tmp_path / "pyxis.log").read_text().splitlines()
    mounts = f"--container-mounts={tmp_path / 'runs'}:{tmp_path / 'runs'}"
    assert pyxis.count("--container-image=nvcr.io#lab/lab:test") == 3  # training twice, then the report
    assert pyxis.count(mounts) == 3 and pyxis.count("--no-container-mount-home") == 3
    assert pyxis.count(f"--container-name=lab-{job_id}") == 3  # one container a node for the job, not an import a step
    assert pyxis.count("--container-env=GLOO_SOCKET_IFNAME") == 3  # the job's settings over the image's
    assert sorted((tmp_path / "ngc.log").read_text().split()) == ["n1", "n1", "n1", "n2", "n2"]  # the entry point ran


def test_srun_with_one_task_per_rank_is_refused_in_one_line_never_two_runs_of_world_size_one(cluster, tmp_path):
    proc = subprocess.run(
        [
            "srun",
            "-N",
            "2",
            "-n",
            "2",
            LAB,
            "train",
            "--config",
            "smoke",
            "--set",
            f"run.output_dir={tmp_path / 'runs'}",
        ],
        env=cluster.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("lab: error:")]
    assert len(lines) == 2 and "task 0 of 2 of a Slurm step" in proc.stderr and "Traceback" not in proc.stderr
    assert "lab launch --slurm" in lines[0] and not (tmp_path / "runs").exists()


def test_each_nodes_exporter_is_announced_to_prometheus_with_the_job_id_then_withdrawn(reference, prometheus):
    folder, job, exporters = reference
    assert job.state == "COMPLETED", _output(folder, job.job_id)[-3000:]
    port = exporters["port"]
    # both nodes' rank 0, scraped, labelled with the job
    assert exporters["seen"] == {f"127.0.0.1:{port}", f"127.0.0.2:{port}"}
    assert list(prometheus["targets"].iterdir()) == []  # withdrawn when the job ended


def test_the_fabric_check_as_a_slurm_job_writes_validate_json_naming_both_nodes(cluster, tmp_path):
    job_id = cluster.sbatch("sbatch -N 2 slurm/validate.sbatch", ROOT, tmp_path, env=_job_env(tmp_path / "runs"))
    job = cluster.wait(job_id)
    out = _output(tmp_path, job_id)
    assert job.state == "COMPLETED", out[-3000:]
    [validate] = (tmp_path / "runs").glob("*/validate.json")
    record = json.loads(validate.read_text())
    assert record["check"] == "validate" and record["ok"] and record["platform"] == "slurm"
    assert sorted(record["nodes"]) == ["n1", "n2"] and record["all_nodes"]["world_size"] == 4
    assert sorted(record["all_nodes"]["hosts"]) == ["n1", "n2"]
    assert "validate: held" in out
    # docs/acceptance.md's pass rule on this run: passed, each CPU node said to have no device check to run
    accept = subprocess.run([PYTHON, "-m", "lab", "accept", str(validate.parent)], capture_output=True, text=True)
    assert accept.returncode == 0 and "accept: held: accepted" in accept.stdout, accept.stdout + accept.stderr
    assert "n1 has no GPU (platform cpu): no device check to run" in accept.stdout


def test_doctor_on_every_node_reports_the_allocation(cluster, tmp_path):
    env = {**cluster.env, "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}"}  # `lab` on PATH, as installed
    proc = subprocess.run(
        ["srun", "-N", "2", "lab", "doctor", "--output-dir", str(tmp_path / "runs")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node, index in (("n1", 0), ("n2", 1)):
        assert f"2 node(s) n1,n2; this is {node} (node {index}), step task {index} of 2" in proc.stdout
    assert proc.stdout.count("not applicable gpu-share") == 2  # one task a node: no GPU to share


# ----------------------------------------------------------------------------- GPU nodes (partition gpu)


def test_on_gpu_nodes_a_job_that_asks_for_no_gpus_is_refused_before_anything_is_made(cluster, tmp_path):
    """Slurm gives a job only the GPUs it asks for: without --gpus-per-node its steps would see none, train on the
    CPU and report success, or validate a DGX as a CPU box. Both scripts refuse, naming the node and the option."""
    for script in ("lab.sbatch", "validate.sbatch"):
        job_id = cluster.sbatch(f"sbatch -p gpu -N 2 slurm/{script}", ROOT, tmp_path, env=_job_env(tmp_path / "runs"))
        job = cluster.wait(job_id)
        out = _output(tmp_path, job_id)
        assert job.state == "FAILED" and job.rc == 2, out[-3000:]
        assert f"{script}: node g1 has 2 GPU(s) (Gres) but this job asked for none" in out
        assert "sbatch --gpus-per-node=2" in out and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "runs").exists()  # checks before effects: no run folder, no run id written


def test_a_job_given_gpus_that_torch_cannot_see_fails_instead_of_training_on_the_cpu(cluster, tmp_path):
    """`sbatch --gpus-per-node=2`: Slurm hands out the stand-in GPUs (CUDA_VISIBLE_DEVICES=0,1), and torch sees
    none (there is no GPU behind them: as with a CPU build of torch or a driver too old). dist.device=auto refuses
    on every rank, in one line each, and the job fails: it never trains on the CPU instead."""
    env = _job_env(tmp_path / "runs", LAB_MAX_RESTARTS="0")  # a refusal is not a fault a restart mends
    del env["LAB_RDZV_PORT"]  # the script's own default (29400 + the job id mod 1000), used by one test at least
    job_id = cluster.sbatch("sbatch -p gpu -N 2 --gpus-per-node=2 slurm/lab.sbatch", ROOT, tmp_path, env=env)
    job = cluster.wait(job_id)
    out = _output(tmp_path, job_id)
    assert job.state == "FAILED" and job.rc != 0, out[-3000:]
    assert "2 rank(s) each" in out  # the node's GPUs, from SLURM_GPUS_ON_NODE
    assert "dist.device=auto: Slurm gave this step GPU(s) 0,1 (SLURM_STEP_GPUS), but torch " in out, out[-3000:]
    assert "does not train on the CPU" in out and not list((tmp_path / "runs").glob("*/metrics.jsonl"))


def test_validate_on_gpu_nodes_whose_steps_see_no_gpu_fails_naming_each_node_and_can_drain_them(cluster, tmp_path):
    """The fabric check as typed for GPU nodes, on nodes whose GPUs torch cannot use: lab validate is given each
    node's Gres (--expect NODE:gpus=2) and fails each node by name, where it would have judged them as CPU nodes;
    LAB_DRAIN=1 drains them with that reason."""
    env = _job_env(tmp_path / "runs", LAB_DRAIN="1")
    job_id = cluster.sbatch("sbatch -p gpu -N 2 --gpus-per-node=2 slurm/validate.sbatch", ROOT, tmp_path, env=env)
    try:
        job = cluster.wait(job_id)
        out = _output(tmp_path, job_id)
        assert job.state == "FAILED" and job.rc == 1, out[-3000:]
        [validate] = (tmp_path / "runs").glob("*/validate.json")
        record = json.loads(validate.read_text())
        assert not record["ok"] and sorted(record["failed_nodes"]) == ["g1", "g2"]
        for node in ("g1", "g2"):
            said = f"{node}: gpus: the node has 2 GPU(s) (2 in Slurm's Gres) but its step saw 0"
            assert any(p.startswith(said) for p in record["problems"]), record["problems"]
            assert f"validate.sbatch: draining {node}: gpus: the node has 2 GPU(s)" in out
            state = cluster.scontrol("show", "node", node).stdout
            assert "DRAIN" in state and f"Reason=lab validate {job_id}: gpus: the node has 2 GPU(s)" in state
        assert (validate.parent / "failed-nodes.tsv").read_text().count("\n") == 2
        # and the pass rule fails the cluster, naming each node
        accept = subprocess.run([PYTHON, "-m", "lab", "accept", str(validate.parent)], capture_output=True, text=True)
        assert accept.returncode == 1 and "accept: failed: not accepted" in accept.stdout, accept.stdout + accept.stderr
        for node in ("g1", "g2"):
            assert f"failed          validate.json: {node}: gpus: the node has 2 GPU(s)" in accept.stdout, accept.stdout
    finally:
        cluster.scontrol("update", "NodeName=g1,g2", "State=RESUME", check=False)
