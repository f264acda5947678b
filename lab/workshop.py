"""The default lab: `make lab` and `docker compose up lab` run this.

1. the baseline: one process, the whole global batch;
2. DDP: N processes under torchrun, the same global batch split over them;
3. a comparison, printed and saved: loss at matching steps, final accuracy, images/s.

Both runs use the same seed, data order and augmentation per sample, so their
loss curves agree up to BatchNorm's per-rank batch statistics and floating-point
reduction order, while the throughput shows what the extra processes buy.
Everything lands in one folder: runs/<workshop id>/{baseline,ddp-N,comparison.md,comparison.json}.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab import config, launch, runs
from lab.errors import LabError


def run(config_name: str, overrides: list[str], nproc_per_node: int, output_dir: str) -> int:
    if nproc_per_node < 2:
        raise LabError(f"--nproc-per-node: {nproc_per_node}; the workshop compares 1 process with 2 or more")
    cfg = config.load(config_name, overrides)  # refuse bad input before anything runs
    config.check_layout(cfg, nproc_per_node)
    workshop_id = runs.new_run_id("workshop")
    folder = Path(output_dir) / workshop_id
    folder.mkdir(parents=True)
    names = {"baseline": "baseline", "ddp": f"ddp-{nproc_per_node}"}
    print(f"workshop {workshop_id}: config {cfg.origin}; results in {folder}", flush=True)

    def target(name: str) -> list[str]:
        return launch.lab_target("train", config_name,
                                 [*overrides, f"run.output_dir={folder}", f"run.id={name}"])

    steps = [
        ("1/3 baseline: 1 process", 1, [sys.executable, *target(names["baseline"])]),
        (f"2/3 DDP: {nproc_per_node} processes, same global batch", nproc_per_node,
         launch.torchrun_command(nproc_per_node, target(names["ddp"]))),
    ]
    for title, processes, command in steps:
        print(f"\n== {title}\n$ {shlex.join(command)}", flush=True)
        if subprocess.call(command, env=launch.worker_env(processes)) != 0:
            print(f"workshop: step '{title}' failed; see the output above", file=sys.stderr)
            return 1
    print("\n== 3/3 comparison", flush=True)
    result = compare(folder / names["baseline"], folder / names["ddp"])
    text = render(result)
    print(text, flush=True)
    (folder / "comparison.md").write_text(text + "\n")
    runs.write_json(folder / "comparison.json", result)
    print(f"\nsaved {folder / 'comparison.md'} and comparison.json", flush=True)
    return 0


def compare(baseline_dir: Path, ddp_dir: Path) -> dict[str, Any]:
    """Loss at the steps both runs logged, final accuracy and throughput of each."""
    summaries = {name: runs.read_json(d / "summary.json") for name, d in (("baseline", baseline_dir), ("ddp", ddp_dir))}
    manifests = {name: runs.read_json(d / "manifest.json") for name, d in (("baseline", baseline_dir), ("ddp", ddp_dir))}
    losses = {name: {r["step"]: r["loss"] for r in runs.read_metrics(d)}
              for name, d in (("baseline", baseline_dir), ("ddp", ddp_dir))}
    steps = sorted(set(losses["baseline"]) & set(losses["ddp"]))
    rows = [{"step": s, "baseline": losses["baseline"][s], "ddp": losses["ddp"][s],
             "relative_difference": abs(losses["ddp"][s] - losses["baseline"][s]) / abs(losses["baseline"][s])}
            for s in steps]
    base_sps, ddp_sps = summaries["baseline"]["samples_per_second"], summaries["ddp"]["samples_per_second"]
    return {
        "data": manifests["baseline"]["data"]["description"],
        "global_batch_size": summaries["baseline"]["global_batch_size"],
        "runs": {name: {"path": str(d), "world_size": summaries[name]["world_size"],
                        "threads_per_process": manifests[name]["ranks"][0]["threads"],
                        "device": manifests[name]["ranks"][0]["device_name"],
                        "test_accuracy": summaries[name]["test_accuracy"],
                        "final_loss": summaries[name]["final_loss"],
                        "samples_per_second": summaries[name]["samples_per_second"]}
                 for name, d in (("baseline", baseline_dir), ("ddp", ddp_dir))},
        "loss_at_matching_steps": rows,
        "max_relative_loss_difference": max((r["relative_difference"] for r in rows), default=None),
        "throughput_ratio_ddp_over_baseline": ddp_sps / base_sps if base_sps and ddp_sps else None,
    }


def render(result: dict[str, Any]) -> str:
    b, d = result["runs"]["baseline"], result["runs"]["ddp"]
    n = d["world_size"]
    lines = [f"data: {result['data']}; global batch {result['global_batch_size']} in both runs", "",
             f"| step | baseline loss | DDP x{n} loss | relative difference |", "|---:|---:|---:|---:|"]
    for r in result["loss_at_matching_steps"]:
        lines.append(f"| {r['step']} | {r['baseline']:.4f} | {r['ddp']:.4f} | {r['relative_difference']:.1e} |")
    ratio = result["throughput_ratio_ddp_over_baseline"]
    lines += [
        "",
        f"| run | processes x threads | device | final loss | test accuracy | images/s |",
        "|---|---|---|---:|---:|---:|",
        f"| baseline | 1 x {b['threads_per_process']} | {b['device']} | {b['final_loss']:.4f} | "
        f"{b['test_accuracy']:.2%} | {b['samples_per_second']:.0f} |",
        f"| DDP | {n} x {d['threads_per_process']} | {d['device']} | {d['final_loss']:.4f} | "
        f"{d['test_accuracy']:.2%} | {d['samples_per_second']:.0f} |",
        "",
        f"DDP x{n} / baseline throughput: {ratio:.2f}x (images/s after the first log interval, which holds warm-up).",
    ]
    if b["device"] == "cpu":
        lines.append("On a CPU both runs share the same cores, so DDP cannot be faster here; on GPUs each process "
                     "has its own device and the ratio approaches the process count.")
    lines.append("Loss curves differ slightly because BatchNorm normalises each rank's part of the batch on its own.")
    return "\n".join(lines)
