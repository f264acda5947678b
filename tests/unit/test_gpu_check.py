"""The device check's own decisions that a CPU can reach: a GPU torch cannot use, and the table."""

from __future__ import annotations

import json

import pytest

from lab.machine.devicecheck import command as gpu_check
from lab.machine.devicecheck import harness
from lab.machine.devicecheck import plan as gpu_plan
from lab.run.cluster import nvml


def test_a_gpu_that_torch_cannot_use_is_named_not_skipped(monkeypatch):
    # No GPU here: NVML's answer is faked (say so). A host with GPUs and a CPU-only torch (or a container started
    # without --gpus) must fail the check, not pass it as "no GPU found".
    monkeypatch.setattr(nvml, "device_count", lambda: 8)
    monkeypatch.setattr(nvml, "driver_version", lambda: "570.86.15")
    reason = gpu_check._gpu_torch_cannot_use()
    assert reason.startswith("the host has 8 NVIDIA GPU(s) (driver 570.86.15), but torch ")
    assert "cannot use them" in reason and "--gpus all" in reason


def test_no_gpu_at_all_is_a_dry_check(monkeypatch):
    monkeypatch.setattr(nvml, "host_has_gpus", lambda: False)
    assert gpu_check._gpu_torch_cannot_use() is None


def test_the_table_counts_what_ran():
    result = {
        "gpu": True,
        "device": "NVIDIA H200",
        "gpus": 1,
        "quick": False,
        "deadline_seconds": 400,
        "versions": {"driver": "570", "cuda": "12.8", "nccl": "2.26", "torch": "2.11.0"},
        "steps": [
            {"step": "doctor", "verdict": "held", "detail": "7 checks"},
            {"step": "all-reduce", "verdict": "not applicable", "detail": "1 GPU"},
            {"step": "memory", "verdict": "failed", "detail": "ratio 1.30"},
        ],
    }
    lines = gpu_check.render(result).splitlines()
    assert lines[0] == "# lab gpu-check: NVIDIA H200 x 1; driver 570, CUDA 12.8, NCCL 2.26, torch 2.11.0"
    assert lines[1].split() == ["doctor", "held", "7", "checks"]
    assert lines[-1] == "gpu-check: failed (1 held, 1 failed, 1 not applicable of 3 step(s))"
    result["steps"][2] = {"step": "memory", "verdict": "not run", "detail": "needs x", "by_deadline": True}
    assert gpu_check.render(result).splitlines()[-1] == (
        "gpu-check: incomplete (1 held, 1 not run, 1 not applicable of 3 step(s)); 1 not run: the 400 s deadline "
        "was spent"
    )


def test_a_check_with_a_step_not_run_is_incomplete_not_passed(capsys):
    """A step left out (for time, --only, a missing package) makes the check incomplete: exit 4, said on one line;
    one the hardware cannot run does not (exit 0); a failed step is exit 1 whatever else."""
    held = gpu_check.Outcome("doctor", "held", "7 checks")
    left_out = gpu_check.Outcome("predict", "not run", "left out to keep the plan within 75% of the 60 s deadline")
    no_gpu = gpu_check.Outcome("all-reduce", "not applicable", "1 GPU on this host")
    assert gpu_check.exit_code([held, no_gpu]) == 0
    assert gpu_check.exit_code([held, left_out, no_gpu]) == 4
    assert capsys.readouterr().out == (
        "gpu-check: incomplete: 1 step(s) not run, so the check does not pass (predict: left out to keep the plan "
        "within 75% of the 60 s deadline)\n"
    )
    assert gpu_check.exit_code([held, left_out, gpu_check.Outcome("memory", "failed", "ratio 1.30")]) == 1


def test_the_levers_line_reads_a_gpu_result(tmp_path, monkeypatch):
    # No GPU here: the `lab bench levers` command is replaced by the 8-GPU result its own tests build (say so);
    # what is checked is the line gpu-check makes of it.
    from tests.distributed.test_levers import _gpu_result

    check = gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=8)
    monkeypatch.setattr(
        gpu_check.Harness,
        "lab",
        lambda self, log, *args: (tmp_path / "levers.json").write_text(json.dumps(_gpu_result())),
    )
    outcome = gpu_check.levers(check)
    assert outcome.verdict == "held"
    assert "images/s vs fp32: bf16 2.00x, fp16 1.90x" in outcome.detail
    assert "(float64) 2.0e-16" in outcome.detail and "NCCL_P2P_DISABLE=1 0.20x" in outcome.detail


@pytest.mark.parametrize("gpus", [1, 8])
def test_the_default_deadline_runs_every_step_the_hardware_allows_with_a_quarter_to_spare(monkeypatch, gpus):
    # Every package present (faked: the preflight's lookup), so the sums are the largest the plan can print.
    monkeypatch.setattr(gpu_plan, "missing", lambda module: False)
    host = gpu_check.Harness(out=None, quick=False, gpu=True, gpus=gpus)
    unbounded = gpu_plan.plan(host, gpu_check.STEPS)
    runnable = [s for s, r in zip(gpu_check.STEPS, unbounded) if not r["left_out"]]
    deadline = gpu_plan.deadline_for(runnable, gpus)
    rows = gpu_plan.plan(host, gpu_check.STEPS, deadline=deadline)
    assert sum(r["expected_seconds"] for r in rows) <= 0.75 * deadline
    assert [r["step"] for r in rows][1:5] == ["FSDP", "bf16 training", "DDP, 1 rank", "host syncs"]  # defects first
    assert [r["step"] for r in rows][-1] == "DDP + compile"  # the one compile, last in the table
    assert {r["left_out"] for r in rows} <= {None, "not applicable"}  # nothing left out: every step in
    if gpus == 1:
        left = {r["step"]: r["why"] for r in rows if r["left_out"]}
        assert left["all-reduce"].startswith("1 GPU on this host: all-reduce needs 2 or more")
        assert left["predict"].startswith("1 GPU on this host: predict needs 3 or more (it measures 1 and 2")
    else:
        assert not any(r["left_out"] for r in rows)
        predict = next(r for r in rows if r["step"] == "predict")
        assert predict["expected_seconds"] == 10 + 10 * 8  # a job per world size: it grows with the GPUs
    one_gpu = gpu_plan.deadline_for(runnable, 1)
    assert gpus == 1 or deadline > one_gpu  # the deadline scales with the GPUs


def test_a_deadline_given_too_short_leaves_steps_not_run_and_names_the_one_that_fits(monkeypatch):
    monkeypatch.setattr(gpu_plan, "missing", lambda module: False)
    host = gpu_check.Harness(out=None, quick=False, gpu=True, gpus=8)
    rows = gpu_plan.plan(host, gpu_check.STEPS, deadline=360)
    assert sum(r["expected_seconds"] for r in rows) <= 0.75 * 360
    left = {r["step"]: r for r in rows if r["left_out"] == "not run"}
    assert "DDP + compile" in left
    why = left["DDP + compile"]["why"]
    assert why.startswith("left out to keep the plan within 75% of the 360 s deadline; --deadline ")
    named = int(why.split("--deadline ")[1].split()[0])
    generous = gpu_plan.plan(host, gpu_check.STEPS, deadline=named)
    assert not [r for r in generous if r["left_out"]]  # the deadline it names runs every step
    cpu = gpu_plan.plan(gpu_check.Harness(out=None, quick=True, gpu=False, gpus=0), gpu_check.STEPS, deadline=540)
    # the bare CPU test runs most of these within its 540 s deadline on 2 cores
    assert sum(r["expected_seconds"] for r in cpu) < 250 and not any(r["left_out"] == "not run" for r in cpu)
    assert not next(r for r in cpu if r["step"] == "predict")["left_out"]  # on a CPU: 3 gloo ranks
    text = gpu_plan.render_plan(rows, 360, quick=False)
    total = sum(r["expected_seconds"] for r in rows)
    kept = sum(not r["left_out"] for r in rows)
    assert text.splitlines()[0] == (
        f"gpu-check plan: {kept} step(s), about {total} s expected (on one H200) of the 360 s deadline"
    )
    assert "  DDP + compile   not run: left out to keep the plan within 75%" in text


def test_the_step_names_are_the_tables_lines():
    assert gpu_check.STEP_NAMES == tuple(line for step in gpu_check.STEPS for line in step.names)
    assert len(set(gpu_check.STEP_NAMES)) == len(gpu_check.STEP_NAMES) == len(gpu_check.STEPS) + 1  # + resume


def test_the_preflight_names_what_a_step_lacks_and_the_step_is_not_run(monkeypatch):
    monkeypatch.setattr(gpu_plan, "missing", lambda module: module in ("lightning", "deepspeed"))
    host = gpu_check.Harness(out=None, quick=False, gpu=True, gpus=8)
    rows = {r["step"]: r for r in gpu_plan.plan(host, gpu_check.STEPS)}
    assert rows["Lightning peer"]["left_out"] == "not run"  # a GPU path untested: the check is incomplete
    assert rows["Lightning peer"]["why"] == "needs lightning (pip install lightning==2.6.6)"
    assert rows["Lightning peer"]["expected_seconds"] == 0
    assert not rows["strategies"]["left_out"]
    assert rows["strategies"]["without"][0].startswith("deepspeed: the ZeRO-1/2/3 rows left out (pip install")
    assert not rows["all-reduce"]["left_out"]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed grandchild waits for PID 1 to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.slow  # waits out a real deadline on a sleeping child: about 7 s
def test_a_step_past_the_deadline_is_stopped_and_the_steps_after_it_are_not_run(tmp_path, monkeypatch):
    # The step table is replaced in-process by three fake steps: one that passes at once, one whose child (with a
    # grandchild, as torchrun has workers) sleeps past the deadline, one after it.
    import argparse
    import sys
    import time

    def slow(c):
        code = (
            "import shutil, subprocess, sys, time; out = sys.argv[1]; "
            "shutil.copy(out + '/gpu-check.json', out + '/seen-by-the-slow-step.json'); "
            "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "open(out + '/pids', 'w').write(f'{__import__(\"os\").getpid()} {worker.pid}'); time.sleep(120)"
        )
        c.child("slow", [sys.executable, "-c", code, str(c.out)])

    steps = (
        gpu_check.Step("at once", 1, 1, lambda c: gpu_check.Outcome("at once", "held", "done")),
        gpu_check.Step("slow", 1, 1, slow),
        gpu_check.Step(
            "after", 1, 1, lambda c: gpu_check.Outcome("after", "held", "done"), lines=("after", "after too")
        ),
    )
    monkeypatch.setattr(gpu_check, "STEPS", steps)
    from lab.run.cluster import provenance

    provenance.versions()  # torch imported and versions read before the clock starts: a loaded CI machine's seconds
    args = argparse.Namespace(
        out=str(tmp_path), quick=True, allow_cpu=True, skip_without_gpu=False, json=None, deadline=15, epochs=1
    )
    started = time.monotonic()
    assert gpu_check.run(args) == 4  # incomplete: nothing failed, and not every step ran
    assert time.monotonic() - started < 15 + 1
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    verdicts = [(s["step"], s["verdict"], s["by_deadline"]) for s in result["steps"]]
    assert verdicts == [
        ("at once", "held", False),
        ("slow", "not run", True),
        ("after", "not run", True),
        ("after too", "not run", True),
    ]
    assert result["verdict"] == "not run"
    assert result["steps"][1]["detail"].startswith("cut by the deadline after ")
    assert result["finished"] and result["plan"][1]["step"] == "slow"
    # Written after every step: while the slow step ran, the file already held the first one's result.
    seen = json.loads((tmp_path / "seen-by-the-slow-step.json").read_text())
    assert [s["step"] for s in seen["steps"]] == ["at once"] and not seen["finished"]
    child, worker = map(int, (tmp_path / "pids").read_text().split())
    assert not _alive(child) and not _alive(worker)  # the whole process group, grandchild included


def test_host_syncs_fail_on_bf16_and_show_syncbatchnorms_own(tmp_path, monkeypatch):
    # No GPU here: the child that measures on CUDA (lab.machine.devicecheck.measure host-syncs) is replaced by its JSON
    # (say so); what is checked is how the step reads it.
    check = gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=1)
    commands = []

    def measured(variants):
        return lambda self, log, command: (
            commands.append(command),
            (tmp_path / "host-syncs.json").write_text(json.dumps({"steps": 12, "variants": variants})),
        )

    monkeypatch.setattr(
        gpu_check.Harness,
        "child",
        measured({"bf16": None, "fp16": None, "sync_batchnorm": "called a synchronizing CUDA op"}),
    )
    outcome = gpu_check.host_syncs(check)
    assert outcome.verdict == "held" and harness.SYNC_BATCHNORM_SYNC + " (expected" in outcome.detail
    assert "sync_batchnorm:train.amp=bf16,model.sync_batchnorm=true,dist.single_process_group=true" in commands[0]
    monkeypatch.setattr(
        gpu_check.Harness,
        "child",
        measured({"bf16": "called a synchronizing CUDA op", "fp16": None, "sync_batchnorm": "x"}),
    )
    with pytest.raises(gpu_check.StepFailed, match="bf16: a host sync inside the step loop"):
        gpu_check.host_syncs(check)


def test_syncbatchnorm_takes_its_sync_path_at_one_rank():
    # torch's SyncBatchNorm falls back to plain batch norm at world size 1; the check routes it through torch's
    # sync function instead. That function needs CUDA (batch_norm_stats): a recorder stands in for it here.
    import torch
    from torch import nn

    from lab.machine.devicecheck import measure as gpu_measure

    calls = []

    class Recorder:
        @staticmethod
        def apply(input, weight, bias, mean, var, eps, momentum, group, world_size):
            calls.append((weight is not None, momentum, world_size))
            return input

    model = nn.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4))
    )
    assert gpu_measure.sync_path_at_one_rank(model, 1, function=Recorder) == 2
    model(torch.randn(2, 3, 8, 8))
    assert calls == [(True, 0.1, 1), (True, 0.1, 1)]
    assert int(model[1].num_batches_tracked) == 1  # counted as torch's forward counts
    model.eval()
    model(torch.randn(2, 3, 8, 8))  # evaluation: torch's own forward (no sync there either)
    assert len(calls) == 2


def _wheel(folder, name, version, requires=()):
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "MARK = 1\n")
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        )
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_the_wheels_chosen_are_those_this_python_lacks(tmp_path):
    from lab.machine.devicecheck import wheels as gpu_wheels

    _wheel(tmp_path, "numpy", "1.0")  # installed here: never shadowed
    fake = _wheel(tmp_path, "labfakewheel", "0.1", ["numpy", "labfakedep>=1", "sphinx; extra == 'docs'"])
    chosen, unmet = gpu_wheels.choose(tmp_path)
    assert chosen == [fake] and unmet == {"labfakewheel": ["labfakedep"]}
    _wheel(tmp_path, "labfakedep", "1.0")
    chosen, unmet = gpu_wheels.choose(tmp_path)
    assert [p.name for p in chosen] == ["labfakedep-1.0-py3-none-any.whl", "labfakewheel-0.1-py3-none-any.whl"]
    assert unmet == {}


def test_a_strategy_that_fails_fails_the_step_and_a_missing_deepspeed_does_not(tmp_path, monkeypatch):
    # No GPU here: `lab bench strategies` is replaced by the table it writes (say so); it exits 1 when a row failed.
    check = gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=1)
    ok = {"state_bytes": 2**20, "loss_gap_from_ddp": 1e-3}
    absent = {"label": "ZeRO-1", "error": "DeepSpeed is not installed (pip install '.[deepspeed]')"}

    def bench(rows, code):
        def lab(self, log, *argv):
            (tmp_path / "strategies.json").write_text(json.dumps({"rows": rows}))
            if code:
                raise gpu_check.StepFailed(f"exit {code}: ...")

        return lab

    monkeypatch.setattr(gpu_check.Harness, "lab", bench([{"label": "DDP", **ok}, {"label": "FSDP", **ok}, absent], 0))
    outcome = gpu_check.strategies(check)
    assert outcome.verdict == "held" and outcome.detail.endswith("; not installed: ZeRO-1")
    broken = {"label": "FSDP", "error": "failed: [rank0]: NotImplementedError: aten._fused_sgd_.default"}
    monkeypatch.setattr(gpu_check.Harness, "lab", bench([{"label": "DDP", **ok}, broken, absent], 1))
    with pytest.raises(gpu_check.StepFailed, match="^FSDP: failed: .rank0.: NotImplementedError"):
        gpu_check.strategies(check)


def _predict_result(gpus: int, device: str = "NVIDIA H200", predicted_from: int = 2) -> dict:
    """`lab predict --json` as it would be on `gpus` GPUs: step times that grow 2% a GPU, predicted 0.5% shorter for
    each GPU past the measured ones."""
    rows, measured = [], []
    for n in range(1, gpus + 1):
        step = 0.030 * (1 + 0.02 * (n - 1))
        guess = step * (1 - 0.005 * max(0, n - predicted_from))
        rows.append(
            {
                "world_size": n,
                "input": n <= predicted_from,
                "predicted_step_seconds": guess,
                "measured_step_seconds": step,
                "predicted_samples_per_second": 256 * n / guess,
                "measured_samples_per_second": 256 * n / step,
                "predicted_exposed_communication_seconds": 0.0005,
                "error": abs(guess - step) / step,
            }
        )
        measured.append({"world_size": n, "device": device, "step_seconds": step})
    return {"benchmark": "predict", "context": "synthetic", "measure_up_to": 2, "rows": rows, "measured": measured}


def test_the_predict_line_states_the_largest_error_and_refuses_what_tested_nothing(tmp_path, monkeypatch):
    # No GPU here: `lab predict` is replaced by the JSON it writes on eight GPUs (say so); what is checked is the
    # command the step runs and the line it makes of the result, and that a result that proved nothing fails it.
    check = gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=8)
    commands = []

    def writes(doc):
        def lab(self, log, *argv):
            commands.append(argv)
            (tmp_path / "predict.json").write_text(json.dumps(doc))

        return lab

    monkeypatch.setattr(gpu_check.Harness, "lab", writes(_predict_result(8)))
    outcome = gpu_check.predict(check)
    argv = commands[0]
    assert argv[0] == "predict" and argv[argv.index("--check-up-to") + 1] == "8"
    assert argv[argv.index("--measure-up-to") + 1] == "2" and argv[argv.index("--config") + 1] == "workshop-gpu"
    assert outcome.verdict == "held" and outcome.figures["rows"][-1]["world_size"] == 8
    assert outcome.detail.startswith(
        "8 GPUs: measured on 1 and 2, predicted then measured on 3-8: largest error 3.0% at 8 (within 10%, "
    )
    assert "bound: met); at 8 a step predicted 33.2 ms, measured 34.2 ms" in outcome.detail
    for doc, says in (
        (_predict_result(8, device="cpu"), "a world size ran on the CPU, not the GPUs"),  # the GPUs unseen
        (_predict_result(8, predicted_from=8), "0 of them predicted"),  # measured only: nothing was predicted
        (_predict_result(4), r"world sizes \[1, 2, 3, 4\] for 1..8"),  # not every GPU of the host
    ):
        monkeypatch.setattr(gpu_check.Harness, "lab", writes(doc))
        with pytest.raises(gpu_check.StepFailed, match=says):
            gpu_check.predict(check)


def _own_ddp_result(backends: dict[int, str]) -> dict:
    """The shape `lab exercise check own-ddp --json` writes, each world size over the backend given."""
    checks = [
        {"name": f"runs on {n} ranks", "verdict": "held", "detail": f"{n} ranks over {b} ended cleanly in 9 s"}
        for n, b in backends.items()
    ]
    checks.append(
        {
            "name": "stage 2 (bucket_mb=0.3): all-reduces overlap the backward",
            "verdict": "held",
            "detail": "54 of 81 all-reduces (67%) in flight while the backward computed more gradients",
        }
    )
    return {"exercise": "own-ddp", "verdict": "held", "seconds": 40.0, "checks": checks}


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_the_own_ddp_line_refuses_a_world_that_fell_back_to_gloo_on_gpus(tmp_path, monkeypatch, gpus):
    # No GPU here: `lab exercise check own-ddp` is replaced by the JSON it writes (say so); what is checked is that
    # the step holds only where every world size the GPUs allow ran over NCCL, and says which did.
    check = gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=gpus)
    from lab.machine.devicecheck import train_steps

    def written(backends: dict[int, str]) -> None:
        monkeypatch.setattr(
            gpu_check.Harness,
            "lab",
            lambda self, log, *args: (tmp_path / "exercise-own-ddp.json").write_text(
                json.dumps(_own_ddp_result(backends))
            ),
        )

    right = {n: "nccl" if gpus >= n else "gloo" for n in (2, 3, 4)}
    written(right)
    line, _ = train_steps.own_ddp(check)
    nccl = ", ".join(str(n) for n in (2, 3, 4) if gpus >= n)
    assert f"{nccl} ranks over nccl" in line and "54 of 81 all-reduces (67%)" in line
    written({n: "gloo" for n in (2, 3, 4)})  # the GPUs hidden from every rank: a CPU run, not the NCCL path
    with pytest.raises(harness.StepFailed, match="did not use nccl"):
        train_steps.own_ddp(check)


def _fix_batchnorm_result(backend: str, gap: float) -> dict:
    """The shape `lab exercise check fix-batchnorm --json` writes: over `backend`, `gap` from the global batch."""
    held = "held" if gap <= 1e-4 else "failed"
    detail = "1 BatchNorm layer(s), 20 training forwards each: the running statistics differ from the global batch's"
    checks = [
        {"name": "ends cleanly", "verdict": "held", "detail": f"2 ranks over {backend} ended cleanly in 9 s"},
        {"name": "the same BatchNorm statistics on every rank", "verdict": "held", "detail": "largest 0"},
        {"name": "the statistics of the global batch", "verdict": held, "detail": f"{detail} by up to {gap:g}"},
    ]
    return {"exercise": "fix-batchnorm", "verdict": held, "seconds": 15.0, "checks": checks}


def test_the_fix_batchnorm_line_holds_only_for_syncbatchnorm_over_nccl_at_the_global_batchs_statistics(
    tmp_path, monkeypatch
):
    # No GPU here: `lab exercise check fix-batchnorm` is replaced by the JSON it writes (say so); what is checked is
    # that the step refuses a CPU run on a GPU host and a solution whose statistics are not the global batch's.
    check = gpu_check.Harness(out=tmp_path, quick=False, gpu=True, gpus=2)
    from lab.machine.devicecheck import train_steps

    def written(doc: dict) -> None:
        path = tmp_path / "exercise-fix-batchnorm.json"
        monkeypatch.setattr(gpu_check.Harness, "lab", lambda self, log, *args: path.write_text(json.dumps(doc)))

    written(_fix_batchnorm_result("nccl", 3e-7))
    line, _ = train_steps.fix_batchnorm(check)
    assert line.startswith("fix-batchnorm's solution (SyncBatchNorm) over nccl") and "by up to 3e-07" in line
    written(_fix_batchnorm_result("gloo", 3e-7))
    with pytest.raises(harness.StepFailed, match="did not use nccl"):
        train_steps.fix_batchnorm(check)
    written(_fix_batchnorm_result("nccl", 0.88))
    with pytest.raises(harness.StepFailed, match="the statistics of the global batch: .* by up to 0.88"):
        train_steps.fix_batchnorm(check)
