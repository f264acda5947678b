#!/usr/bin/env python3
"""What only a GPU can prove of the lab's NCCL paths (issue 49), in one run of at most 8 minutes, a table last:

1. recorder   a 1-rank NCCL group's collectives are in the rank's record (NCCL's own recorder, _dump_nccl_trace):
              entries and the group's status, each all-reduce with its line
2. observer   the exercises' observer on CUDA: a 1-rank DDP run with accumulation, under
              torch.cuda.set_sync_debug_mode("error") (the observer's own work may not sync the host), its bucket
              all-reduces counted per step, its losses read at the end, every collective left once done
3. gpu-check  the device check's single-GPU steps the old 360 s default left out: metrics, hang record, Lightning
              peer, DDP + compile (`--only`: the check says incomplete, exit 4, for the steps not asked)
4. learns     workshop-gpu's first 96 steps (batch 2048, its learning rate and warm-up) on synthetic data: the test
              accuracy it reaches

    PYTHONPATH=$PWD python3 scripts/gpu_truth.py runs/gpu-truth      # on a GPU host; refuses without one

No venv needed: torch, torchvision, PyYAML and numpy (and lightning, prometheus_client for their steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_SECONDS = 480  # the whole run: 8 minutes

RECORDER = """
import json, os, sys, torch, torch.distributed as dist
from lab.run.cluster import flight
flight.enable()
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
dist.barrier()
torch.cuda.synchronize()
snap = flight.snapshot("gpu truth")
json.dump({"groups": snap["groups"], "ops": [e["op"] for e in snap["entries"]],
           "where": [e["where"] for e in snap["entries"]], "source": snap["source"]}, open(sys.argv[1], "w"))
dist.destroy_process_group()
"""

LEARNER = """
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda(),
            device_ids=[0], bucket_cap_mb=1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs, labels = torch.randn(64, 256, device="cuda"), torch.randint(0, 10, (64,), device="cuda")
torch.cuda.synchronize()
for step in range(9):
    if step == 1:  # after DDP's first step (it builds its buckets): any host sync from here on raises
        torch.cuda.set_sync_debug_mode("error")
    for micro in range(2):
        if micro == 0:
            with model.no_sync():
                F.cross_entropy(model(inputs), labels).backward()
        else:
            F.cross_entropy(model(inputs), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
torch.cuda.set_sync_debug_mode(0)
dist.destroy_process_group()
"""


def run(label: str, command: list[str], out: Path, limit: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `command` with its output in OUT/LABEL.log; (exit code, the log's last line)."""
    log = out / f"{label}.log"
    with open(log, "w") as f:
        try:
            done = subprocess.run(
                command, stdout=f, stderr=subprocess.STDOUT, timeout=limit, env=env, cwd=ROOT, check=False
            )  # its exit code is the verdict's to read
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    lines = log.read_text().strip().splitlines()
    return code, (lines[-1] if lines else "no output")


def torchrun(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", str(script), *args]


def recorder(out: Path) -> tuple[bool, str]:
    script, result = out / "recorder.py", out / "recorder.json"
    script.write_text(textwrap.dedent(RECORDER))
    code, last = run("recorder", torchrun(script, str(result)), out, 120)
    if code != 0 or not result.exists():
        return False, f"exit {code}: {last}"
    doc = json.loads(result.read_text())
    status = doc["groups"].get("0", {})
    ok = doc["source"] == "flight recorder" and status.get("enqueued", 0) >= 4 and "all_reduce" in doc["ops"]
    return ok, f"{doc['source']}: group 0 {status}, ops {sorted(set(doc['ops']))}, lines {doc['where'][-1:]}"


def observer(out: Path) -> tuple[bool, str]:
    script, trace = out / "learner.py", out / "trace"
    script.write_text(textwrap.dedent(LEARNER))
    observed = [sys.executable, "-m", "lab.course.exercises.observe", "--trace", str(trace), str(script)]
    command = [*torchrun(script)[:-1], "-m", *observed[2:]]
    code, last = run("observer", command, out, 120)
    if code != 0:
        return False, f"exit {code} (a host sync raises under set_sync_debug_mode('error')): {last}"
    from lab.course.exercises import trace as traces

    rank = traces.read(trace, 1)[0]
    per_step, losses = rank.allreduces_per_step(), rank.losses
    deferred = sum(1 for e in rank.of("loss") if "i" in e)
    ok = len(per_step) == 9 and min(per_step) >= 1 and len(losses) == 18 and deferred == 18 and not rank.waiting()
    return ok, f"bucket all-reduces per step {per_step}; {len(losses)} losses, {deferred} read at the end"


def gpu_check(out: Path) -> tuple[bool, str]:
    steps = ("metrics", "hang record", "Lightning peer", "DDP + compile")
    only = [a for s in steps for a in ("--only", s)]
    command = [sys.executable, "-m", "lab", "gpu-check", "--out", str(out / "gpu-check"), *only, "--deadline", "300"]
    code, _ = run("gpu-check", command, out, 330)
    result = out / "gpu-check" / "gpu-check.json"
    if not result.exists():
        return False, f"exit {code}, no gpu-check.json"
    verdicts = {s["step"]: s["verdict"] for s in json.loads(result.read_text())["steps"] if s["step"] in steps}
    return code == 4 and set(verdicts.values()) == {"held"}, f"exit {code}; {verdicts}"


def learns(out: Path) -> tuple[bool, str]:
    sets = [
        "data.source=synthetic",
        "data.synthetic_train_size=49152",
        "data.synthetic_test_size=4096",
        "train.epochs=4",
        "checkpoint.save=false",
        "metrics.port_base=0",
        f"run.output_dir={out / 'runs'}",
        "run.id=workshop-gpu-96",
    ]
    command = [
        sys.executable,
        "-m",
        "lab",
        "train",
        "--config",
        "workshop-gpu",
        *[x for s in sets for x in ("--set", s)],
    ]
    code, last = run("learns", command, out, 180)
    summary = out / "runs" / "workshop-gpu-96" / "summary.json"
    if code != 0 or not summary.exists():
        return False, f"exit {code}: {last}"
    doc = json.loads(summary.read_text())
    accuracy = doc.get("test_accuracy") or 0.0
    return (
        accuracy >= 0.5,
        f"96 steps at batch 2048: test accuracy {accuracy:.1%}, {doc.get('samples_per_second', 0):,.0f} images/s",
    )


def main(argv: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_truth: no CUDA device: what this proves needs a GPU (the CPU tests prove the rest)", file=sys.stderr)
        return 2
    out = Path(argv[0] if argv else "runs/gpu-truth").resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    started, rows = time.monotonic(), []
    for name, prove in (("recorder", recorder), ("observer", observer), ("gpu-check", gpu_check), ("learns", learns)):
        if time.monotonic() - started > LIMIT_SECONDS:
            rows.append((name, "not run", "the 8 minutes were spent"))
            continue
        began = time.monotonic()
        held, said = prove(out)
        rows.append((name, "held" if held else "failed", f"{said} ({time.monotonic() - began:.0f} s)"))
    print(f"# gpu truth: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    for name, verdict, said in rows:
        print(f"{name:<10} {verdict:<8} {said}")
    return 0 if all(v == "held" for _, v, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
