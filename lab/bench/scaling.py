"""Strong and weak scaling of the real training step, 1..N processes.

    lab bench scaling --mode weak --max-world-size 8 --json scaling.json

Each world size is its own torchrun job running the lab's Trainer on synthetic
data: warm-up steps, then timed blocks. Blocks alternate between normal DDP steps
and steps under `no_sync()` (no gradient all-reduce), interleaved so both see the
same machine; their difference is the step time spent waiting on communication.

Definitions (as in Horovod's and the DDP paper's scaling tables):
    speedup    = thr_N / thr_1
    efficiency = thr_N / (N * thr_1)
    Karp-Flatt serial fraction e = (1/speedup - 1/N) / (1 - 1/N)     (N > 1)

>>> rows = derive([{"world_size": 1, "samples_per_second": 100.0}, {"world_size": 2, "samples_per_second": 160.0}])
>>> rows[1]["speedup"], rows[1]["efficiency"], rows[1]["karp_flatt"]
(1.6, 0.8, 0.25)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from lab import cores
from lab.errors import LabError


def derive(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speedup, efficiency and the Karp-Flatt fraction against the world-size-1 row."""
    base = rows[0]["samples_per_second"] / rows[0]["world_size"]
    out = []
    for r in rows:
        n = r["world_size"]
        speedup = r["samples_per_second"] / base
        karp = (1 / speedup - 1 / n) / (1 - 1 / n) if n > 1 else None
        out.append({**r, "speedup": round(speedup, 12), "efficiency": round(speedup / n, 12),
                    "karp_flatt": round(karp, 12) if karp is not None else None})
    return out


def render(rows: list[dict[str, Any]], mode: str, context: str) -> str:
    lines = [f"{mode.capitalize()} scaling: {context}", "",
             "| world size | global batch | images/s | images/s per rank | speedup | efficiency | Karp-Flatt e "
             "| communication share |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        karp = "-" if r["karp_flatt"] is None else f"{r['karp_flatt']:.3f}"
        comm = "-" if r["communication_share"] is None else f"{r['communication_share']:.1%}"
        lines.append(f"| {r['world_size']} | {r['global_batch_size']} | {r['samples_per_second']:.1f} | "
                     f"{r['samples_per_second'] / r['world_size']:.1f} | {r['speedup']:.2f} | "
                     f"{r['efficiency']:.1%} | {karp} | {comm} |")
    lines.append("communication share = 1 - (step time under no_sync) / (step time with the all-reduce), "
                 "interleaved blocks")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the parent


def run(args) -> int:
    from lab import config, launch, plots, runs

    world_sizes = _world_sizes(args.max_world_size)
    gpu = _has_cuda()
    args.batch_per_rank = args.batch_per_rank or (256 if gpu else 64)
    args.global_batch = args.global_batch or (2048 if gpu else 128)
    base_overrides = list(args.overrides)
    args.config = args.config or ("workshop-gpu" if gpu else "workshop-cpu")
    cfg = config.load(args.config, base_overrides)
    for n in world_sizes:
        config.check_layout(config.with_overrides(cfg, train={"global_batch_size": _global_batch(args, n)}), n)
    threads = cores.threads_per_process(world_sizes[-1])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in world_sizes:
            out = Path(tmp) / f"n{n}.json"
            target = ["-m", "lab.bench.scaling", "--config", args.config, "--out", str(out),
                      "--steps", str(args.steps), "--warmup", str(args.warmup), "--global-batch",
                      str(_global_batch(args, n)), *[x for o in base_overrides for x in ("--set", o)]]
            command = launch.torchrun_command(n, target)
            # The same threads per process at every N: each rank has the compute of `threads` cores,
            # as each GPU rank has one GPU; more processes do not get more cores each.
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            print(f"$ {' '.join(command)}", flush=True)
            if subprocess.call(command, env=env, stdout=subprocess.DEVNULL) != 0:
                print(f"scaling: world size {n} failed", file=sys.stderr)
                return 1
            results.append(json.loads(out.read_text()))
    rows = derive(results)
    device = results[0]["device"]
    context = (f"{results[0]['data']}, ResNet-18 width {cfg.model.width}, {device}, "
               f"{threads} thread(s) per process" if device == "cpu" else
               f"{results[0]['data']}, ResNet-18 width {cfg.model.width}, {device}")
    text = render(rows, args.mode, context)
    print(text, flush=True)
    result = {"benchmark": "scaling", "mode": args.mode, "rows": rows, "context": context,
              "threads_per_process": threads, "steps": args.steps, "warmup": args.warmup}
    if args.json:
        runs.write_json(args.json, result)
    if args.pushgateway:
        from lab import metrics

        metrics.push_scaling(args.pushgateway, runs.new_run_id("scaling"), rows, args.mode)
    if args.plot:
        plots.scaling(rows, args.mode, context, Path(args.plot))
        print(f"plot: {args.plot}", flush=True)
    return 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _world_sizes(limit: int | None) -> list[int]:
    import torch

    available = torch.cuda.device_count() if _has_cuda() else cores.available()
    top = limit or available
    if top < 1:
        raise LabError(f"--max-world-size {top}: need at least 1")
    return list(range(1, top + 1))


def _global_batch(args, n: int) -> int:
    return args.batch_per_rank * n if args.mode == "weak" else args.global_batch


# ----------------------------------------------------------------------------- one world size (a torchrun worker)


def worker(argv: list[str]) -> None:
    import argparse

    import torch

    from lab import config, dist, provenance, runs
    from lab.bench import harness

    p = argparse.ArgumentParser()
    p.add_argument("--config")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    args = p.parse_args(argv)
    # Synthetic data sized for the steps, so no epoch boundary interrupts a block.
    cfg = harness.synthetic_config(config.load(args.config, args.overrides), args.global_batch,
                                   batches=args.steps + args.warmup + 1)
    with harness.trainer_session(cfg) as (ctx, trainer, dataset):
        batches = trainer.train_loader.forever()

        def block(steps: int, sync: bool) -> float:
            def train() -> None:
                for _ in range(steps):
                    trainer.train_step(*next(batches), sync=sync)

            return harness.timed(ctx, train, barrier=True)

        block(args.warmup, True)
        seconds = {True: 0.0, False: 0.0}
        counted = {True: 0, False: 0}
        half = max(1, args.steps // 4)
        for sync in (True, False, True, False)[: 4 if ctx.distributed else 1]:
            steps = half if ctx.distributed else args.steps
            seconds[sync] += block(steps, sync)
            counted[sync] += steps
        step_seconds = seconds[True] / counted[True]
        no_sync_seconds = seconds[False] / counted[False] if counted[False] else None
        # Every rank's clock counts: the slowest rank sets the pace.
        step_seconds = max(dist.all_gather_object(ctx, step_seconds))
        if no_sync_seconds is not None:
            no_sync_seconds = max(dist.all_gather_object(ctx, no_sync_seconds))
        if ctx.is_primary:
            runs.write_json(args.out, {
                "world_size": ctx.world_size, "global_batch_size": args.global_batch,
                "batch_size_per_rank": trainer.batch_size, "step_seconds": step_seconds,
                "no_sync_step_seconds": no_sync_seconds,
                "samples_per_second": args.global_batch / step_seconds,
                "communication_share": max(0.0, 1 - no_sync_seconds / step_seconds) if no_sync_seconds else None,
                "device": provenance.describe(ctx)["device_name"], "data": dataset.description.split(" (")[0],
                "threads": torch.get_num_threads(), "timed_steps": counted[True]})


if __name__ == "__main__":
    worker(sys.argv[1:])
