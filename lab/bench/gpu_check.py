"""One command that checks the lab on one H100/H200 and prints a short table last.

    lab bench gpu-check --json gpu-check.json          # about 5 minutes on one H100/H200

Steps, each a real command of the lab (their own output scrolls by first):
1. `lab bench pipeline`: images/s of the lab's data path and training step (bf16,
   channels_last, torch.compile) against a torchvision DataLoader path, batch 512;
2. `lab train`: ResNet-18 on synthetic data for a fixed number of epochs: wall time
   and test accuracy;
3. a host-sync guard: training steps under torch.cuda.set_sync_debug_mode("error");
4. `lab memory --measure`: peak memory measured against the estimator;
5. `lab bench metrics-overhead`: exporter on vs off;
then GPU model, driver, CUDA and NCCL versions.

Targets on one H100/H200: >= 60,000 training images/s at batch 512, >= 10x the
DataLoader path, metrics overhead <= 1%. `--quick --allow-cpu` runs the same steps
at toy sizes on a CPU, so the command itself is tested where no GPU is.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.memory import MEASURED_RECIPE
from lab.memory import estimate as estimate_memory

TARGET_IMAGES_PER_SECOND = 60_000
TARGET_PIPELINE_RATIO = 10.0
TARGET_METRICS_OVERHEAD = 0.01


def run(args) -> int:
    import torch

    from lab import dist, runs

    if not torch.cuda.is_available() and not args.allow_cpu:
        raise LabError("gpu-check: no CUDA device is visible; run it on a GPU host (or --quick --allow-cpu to test it)")
    quick = args.quick
    common = ["--set", "model.width=8"] if quick else ["--set", "model.compile=true", "--set", "train.amp=bf16",
                                                       "--set", "model.channels_last=true"]
    config = "smoke" if quick else "workshop-gpu"
    results: dict[str, Any] = {"benchmark": "gpu-check", "versions": dist.versions(),
                               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)

        def lab(*argv: str) -> None:
            command = [sys.executable, "-m", "lab", *argv]
            print(f"\n$ {' '.join(command)}", flush=True)
            if subprocess.call(command) != 0:
                raise RuntimeError(f"gpu-check step failed: {' '.join(argv[:3])}")

        lab("bench", "pipeline", "--config", config, *common, "--batch-size", "64" if quick else "512",
            "--batches", "2" if quick else "50", "--rounds", "1" if quick else "3",
            "--num-workers", "0" if quick else "8", "--json", str(tmp_path / "pipeline.json"))
        results["pipeline"] = runs.read_json(tmp_path / "pipeline.json")

        epochs = 1 if quick else args.epochs
        t0 = time.time()
        lab("train", "--config", config, *common, "--set", "data.source=synthetic", "--set", f"train.epochs={epochs}",
            "--set", f"run.output_dir={tmp_path / 'runs'}", "--set", "run.id=gpu-check", "--set", "checkpoint.save=false",
            *(["--set", "data.synthetic_train_size=256", "--set", "data.synthetic_test_size=64"] if quick else []))
        summary = runs.read_json(tmp_path / "runs" / "gpu-check" / "summary.json")
        results["training"] = {"epochs": epochs, "wall_time_seconds": time.time() - t0,
                               "test_accuracy": summary["test_accuracy"],
                               "samples_per_second": summary["samples_per_second"]}

        results["sync_guard"] = sync_guard(config, common, quick)

        lab("memory", "--measure", "--measure-width", "8" if quick else "64", "--world-size", "1",
            "--json", str(tmp_path / "memory.json"))
        memory = runs.read_json(tmp_path / "memory.json")["measured"]["single"]
        estimate = estimate_memory(memory["parameter_count"], 1, *MEASURED_RECIPE)[0]["total_bytes"]
        results["memory"] = {"measured_bytes": memory["measured_bytes"], "estimate_bytes": estimate,
                             "ratio": memory["measured_bytes"] / estimate}

        lab("bench", "metrics-overhead", "--config", config, *common, "--rounds", "1" if quick else "3",
            "--steps", "4" if quick else "100", "--json", str(tmp_path / "overhead.json"))
        results["metrics_overhead"] = runs.read_json(tmp_path / "overhead.json")["overhead"]

    print("\n" + render(results), flush=True)
    if args.json:
        runs.write_json(args.json, results)
    return 0


def sync_guard(config_name: str, common: list[str], quick: bool) -> dict[str, Any]:
    """Training steps with CUDA's sync debug mode set to error: any host sync between log intervals raises."""
    import torch

    from lab import config, data, dist
    from lab.train import Trainer

    overrides = [common[i + 1] for i in range(0, len(common), 2)]
    cfg = config.load(config_name, [*overrides, "data.source=synthetic", "data.synthetic_train_size=4096",
                                    "data.synthetic_test_size=64", "train.global_batch_size=256"])
    ctx = dist.init(cfg.dist)
    try:
        trainer = Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device))
        batches = trainer.train_loader.epoch(0)  # 16 batches: no epoch boundary inside the guarded steps
        steps = 4 if quick else 12
        for _ in range(2):  # warm-up (compilation syncs)
            trainer.train_step(*next(batches))
        if ctx.device.type != "cuda":
            return {"checked": False, "reason": "no CUDA device (the CPU test counts syncs instead)"}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(steps):
                trainer.train_step(*next(batches))
        except RuntimeError as exc:
            return {"checked": True, "passed": False, "error": str(exc).splitlines()[0]}
        finally:
            torch.cuda.set_sync_debug_mode("default")
        trainer.flush_log()  # the one sync, outside the guarded loop
        return {"checked": True, "passed": True, "steps": steps}
    finally:
        dist.teardown(ctx)


def render(r: dict[str, Any]) -> str:
    p, t, v = r["pipeline"], r["training"], r["versions"]
    med = p["median_images_per_second"]
    guard = r["sync_guard"]
    guard_text = ("passed" if guard.get("passed") else f"FAILED: {guard.get('error')}") if guard["checked"] else \
        f"not checked ({guard['reason']})"

    def mark(ok: bool) -> str:
        return "met" if ok else "missed"

    rows = [
        ("device", f"{r['device']}; driver {v.get('driver')}, CUDA {v.get('cuda')}, NCCL {v.get('nccl')}, "
                   f"torch {v.get('torch')}"),
        ("training images/s (lab path, batch 512)",
         f"{med['lab_train']:.0f} (target {TARGET_IMAGES_PER_SECOND}: "
         f"{mark(med['lab_train'] >= TARGET_IMAGES_PER_SECOND)})"),
        ("training images/s (DataLoader path)", f"{med['torchvision_train']:.0f}"),
        ("lab / DataLoader, training step", f"{p['train_ratio_lab_over_torchvision']:.1f}x (target "
                                            f"{TARGET_PIPELINE_RATIO:.0f}x: "
                                            f"{mark(p['train_ratio_lab_over_torchvision'] >= TARGET_PIPELINE_RATIO)})"),
        ("lab / DataLoader, data path alone", f"{p['data_ratio_lab_over_torchvision']:.1f}x"),
        (f"{t['epochs']} epochs of synthetic data", f"{t['wall_time_seconds']:.1f} s wall, test accuracy "
                                                    f"{t['test_accuracy']:.2%}"),
        ("host syncs between log intervals", guard_text),
        ("peak memory measured / estimate", f"{r['memory']['ratio']:.2f} "
                                            f"({r['memory']['measured_bytes'] / 1e6:.0f} MB measured)"),
        ("metrics overhead", f"{r['metrics_overhead']:+.2%} (target <= +1%: "
                             f"{mark(r['metrics_overhead'] <= TARGET_METRICS_OVERHEAD)})"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(["# lab gpu-check", *(f"{k.ljust(width)}  {val}" for k, val in rows)])

