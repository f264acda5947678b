"""The default lab: `make lab` and `docker compose up lab` run this.

1. the baseline: one process (one GPU), the whole global batch;
2. DDP with the same global batch split over N processes: N = 2 on a CPU; 2, 4, 8 GPUs
   (as many as the host has) on a GPU server, each run on the first N devices;
3. a comparison of the runs, printed and saved: loss at matching steps, final accuracy, images/s;
4. the all-reduce benchmark over the largest N (nccl-tests' algbw and busbw);
5. weak scaling of the training step over 1..N processes;
6. the memory footprint of a 7B model under DDP vs ZeRO/FSDP, and ResNet-18 measured;
7. the same training under DDP, FSDP and DeepSpeed ZeRO-1/2/3 side by side (memory per rank, images/s,
   loss curves) over the largest N;
8. a report with plots.

Everything lands in one folder: runs/<workshop id>/{baseline, ddp-N, comparison.md,
allreduce.json, scaling.json, memory.json, strategies.json, report.md, *.png}.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from lab import config, launch, runs
from lab.errors import LabError


def ddp_sizes(requested: int | None, gpus: int) -> list[int]:
    """World sizes for the DDP runs: the one asked for, else 2, 4, 8, ... up to the GPUs present.

    >>> ddp_sizes(None, 0), ddp_sizes(None, 8), ddp_sizes(None, 6), ddp_sizes(3, 8)
    ([2], [2, 4, 8], [2, 4, 6], [3])
    """
    if requested is not None:
        return [requested]
    if gpus < 2:
        return [2]
    sizes = [n for n in (2, 4, 8, 16, 32) if n <= gpus]
    return sizes if sizes[-1] == gpus else [*sizes, gpus]


def default_config() -> str:
    """workshop-gpu where CUDA devices are visible, else workshop-cpu: a plain `lab workshop` (the
    image's default command) fits the machine it runs on."""
    import torch

    return "workshop-gpu" if torch.cuda.is_available() else "workshop-cpu"


def run(config_name: str, overrides: list[str], nproc_per_node: int | None, output_dir: str) -> int:
    import torch

    if nproc_per_node is not None and nproc_per_node < 2:
        raise LabError(f"--nproc-per-node: {nproc_per_node}; the workshop compares 1 process with 2 or more")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    sizes = ddp_sizes(nproc_per_node, gpus)
    if gpus and sizes[-1] > gpus:
        raise LabError(f"--nproc-per-node: {sizes[-1]} processes but this host has {gpus} GPU(s)")
    cfg = config.load(config_name, overrides)  # refuse bad input before anything runs
    for n in sizes:
        config.check_layout(cfg, n)
    workshop_id = runs.new_run_id("workshop")
    folder = Path(output_dir) / workshop_id
    folder.mkdir(parents=True)
    print(f"workshop {workshop_id}: config {cfg.origin}; results in {folder}", flush=True)

    def train_target(name: str) -> list[str]:
        return launch.lab_target("train", config_name, [*overrides, f"run.output_dir={folder}", f"run.id={name}"])

    largest = sizes[-1]
    on_gpu = gpus > 0
    steps: list[tuple[str, int, Any]] = [("baseline: 1 process", 1, [sys.executable, *train_target("baseline")])]
    for n in sizes:
        steps.append((f"DDP: {n} processes, same global batch", n, launch.torchrun_command(n, train_target(f"ddp-{n}"))))
    steps.append(("comparison", 0, lambda: _compare_and_save(folder, sizes)))
    steps.append((f"all-reduce bus bandwidth over {largest} ranks", largest, launch.torchrun_command(
        largest, ["-m", "lab", "bench", "allreduce", "-b", "8", "-e", "1G" if on_gpu else "64M",
                  "-n", "20" if on_gpu else "10", "-w", "5" if on_gpu else "2", "--json", str(folder / "allreduce.json")])))
    set_args = [x for o in overrides for x in ("--set", o)]
    # The scaling step gives each process the threads of `largest` processes at every world size (fair CPU split).
    steps.append((f"weak scaling over 1..{largest} processes", largest, [
        sys.executable, "-m", "lab", "bench", "scaling", "--config", config_name, *set_args, "--mode", "weak",
        "--max-world-size", str(largest), "--steps", "40" if on_gpu else "12", "--warmup", "10" if on_gpu else "3",
        "--json", str(folder / "scaling.json")]))
    device = "h200" if on_gpu and "H200" in torch.cuda.get_device_name(0) else "h100"
    steps.append(("memory: a 7B model under DDP vs ZeRO/FSDP, and ResNet-18 measured", 1, [
        sys.executable, "-m", "lab", "memory", "--params", "7e9", "--world-size", "8", "--device", device,
        "--measure", "--json", str(folder / "memory.json")]))
    steps.append((f"strategies: DDP, FSDP and ZeRO-1/2/3 over {largest} ranks", largest, [
        sys.executable, "-m", "lab", "bench", "strategies", "--config", config_name, *set_args,
        "--nproc-per-node", str(largest), "--steps", "20" if on_gpu else "6", "--json", str(folder / "strategies.json")]))

    total = len(steps) + 1  # + the report
    for index, (title, processes, command) in enumerate(steps, start=1):
        if callable(command):  # a step of this process
            print(f"\n== {index}/{total} {title}", flush=True)
            command()
            continue
        print(f"\n== {index}/{total} {title}\n$ {shlex.join(command)}", flush=True)
        if subprocess.call(command, env=_env(processes, on_gpu)) != 0:
            print(f"workshop: step '{title}' failed; see the output above", file=sys.stderr)
            return 1
    print(f"\n== {total}/{total} report", flush=True)
    from lab import report

    path = report.build([str(folder)])
    print(f"report: {path}", flush=True)
    return 0


def _env(processes: int, on_gpu: bool) -> dict[str, str]:
    env = launch.worker_env(processes)
    if on_gpu:  # the first N devices, as CUDA_VISIBLE_DEVICES=0..N-1 would give
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(processes))))
    return env


def _compare_and_save(folder: Path, sizes: list[int]) -> None:
    result = compare(folder / "baseline", {f"ddp-{n}": folder / f"ddp-{n}" for n in sizes})
    text = render(result)
    print(text, flush=True)
    (folder / "comparison.md").write_text(text + "\n")
    runs.write_json(folder / "comparison.json", result)


def compare(baseline_dir: Path, ddp_dirs: dict[str, Path]) -> dict[str, Any]:
    """Loss at the steps every run logged, final accuracy and throughput of each."""
    dirs = {"baseline": baseline_dir, **ddp_dirs}
    summaries = {name: runs.read_json(d / "summary.json") for name, d in dirs.items()}
    manifests = {name: runs.read_json(d / "manifest.json") for name, d in dirs.items()}
    losses = {name: {r["step"]: r["loss"] for r in runs.read_metrics(d)} for name, d in dirs.items()}
    steps = sorted(set.intersection(*(set(v) for v in losses.values())))
    base = losses["baseline"]
    rows = [{"step": s, **{name: losses[name][s] for name in dirs},
             "max_relative_difference": max(abs(losses[name][s] - base[s]) / abs(base[s]) for name in ddp_dirs)}
            for s in steps]
    base_sps = summaries["baseline"]["samples_per_second"]
    return {
        "data": manifests["baseline"]["data"]["description"],
        "global_batch_size": summaries["baseline"]["global_batch_size"],
        "runs": {name: {"path": str(d), "world_size": summaries[name]["world_size"],
                        "threads_per_process": manifests[name]["ranks"][0]["threads"],
                        "device": manifests[name]["ranks"][0]["device_name"],
                        "test_accuracy": summaries[name]["test_accuracy"],
                        "final_loss": summaries[name]["final_loss"],
                        "samples_per_second": summaries[name]["samples_per_second"],
                        "throughput_ratio_to_baseline": summaries[name]["samples_per_second"] / base_sps}
                 for name, d in dirs.items()},
        "loss_at_matching_steps": rows,
    }


def render(result: dict[str, Any]) -> str:
    names = list(result["runs"])
    titles = {name: "baseline" if name == "baseline" else f"DDP x{result['runs'][name]['world_size']}" for name in names}
    lines = [f"data: {result['data']}; global batch {result['global_batch_size']} in every run", "",
             "| step | " + " | ".join(f"{titles[n]} loss" for n in names) + " | largest relative difference |",
             "|---:|" + "---:|" * (len(names) + 1)]
    for r in result["loss_at_matching_steps"]:
        lines.append(f"| {r['step']} | " + " | ".join(f"{r[n]:.4f}" for n in names) +
                     f" | {r['max_relative_difference']:.1e} |")
    lines += ["", "| run | processes x threads | device | final loss | test accuracy | images/s | vs baseline |",
              "|---|---|---|---:|---:|---:|---:|"]
    for name in names:
        r = result["runs"][name]
        lines.append(f"| {titles[name]} | {r['world_size']} x {r['threads_per_process']} | {r['device']} | "
                     f"{r['final_loss']:.4f} | {r['test_accuracy']:.2%} | {r['samples_per_second']:.0f} | "
                     f"{r['throughput_ratio_to_baseline']:.2f}x |")
    lines.append("")
    lines.append("images/s are counted after the first log interval, which holds the warm-up.")
    if result["runs"]["baseline"]["device"] == "cpu":
        lines.append("On a CPU all runs share the same cores, so DDP cannot be faster here; on GPUs each process "
                     "has its own device and the ratio approaches the process count.")
    lines.append("Loss curves differ slightly because BatchNorm normalises each rank's part of the batch on its own.")
    return "\n".join(lines)

