"""Strong and weak scaling of the real training step over 1, 2, 4, ... N processes, with Amdahl's or
Gustafson's law fitted to the speedups.

    lab bench scaling --mode strong --max-world-size 8 --json strong.json --plot strong.png

Each world size is its own torchrun job running the lab's Trainer on synthetic data: warm-up steps,
then timed blocks, interleaved so all see the same machine: normal DDP steps; steps under
`no_sync()` (no gradient all-reduce); forward + backward alone. Their differences split a step into
compute, the rest of a step (optimizer, zeroing), and the communication the backward pass did not hide.

Definitions (as in Horovod's and the DDP paper's scaling tables):
    speedup    = thr_N / thr_1
    efficiency = thr_N / (N * thr_1)
    Karp-Flatt serial fraction e = (1/speedup - 1/N) / (1 - 1/N)     (N > 1)
Strong mode fits Amdahl's serial fraction to the speedups, weak mode Gustafson's (lab.scaling_laws),
and projects both to 8, 64 and 512 workers.

>>> rows = derive([{"world_size": 1, "samples_per_second": 100.0}, {"world_size": 2, "samples_per_second": 160.0}])
>>> rows[1]["speedup"], rows[1]["efficiency"], rows[1]["karp_flatt"]
(1.6, 0.8, 0.25)
>>> world_sizes(8), world_sizes(6), world_sizes(1)
([1, 2, 4, 8], [1, 2, 4, 6], [1])
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab import scaling_laws
from lab.errors import LabError
from lab.run.cluster import cores

if TYPE_CHECKING:  # imported where used: `lab bench --help` must not wait for torch
    from lab.run.cluster.dist import DistContext
    from lab.run.config import Config


def derive(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speedup, efficiency and the Karp-Flatt fraction against the world-size-1 row."""
    base = rows[0]["samples_per_second"] / rows[0]["world_size"]
    out = []
    for r in rows:
        n = r["world_size"]
        speedup = r["samples_per_second"] / base
        karp = (1 / speedup - 1 / n) / (1 - 1 / n) if n > 1 else None
        out.append(
            {
                **r,
                "speedup": round(speedup, 12),
                "efficiency": round(speedup / n, 12),
                "karp_flatt": round(karp, 12) if karp is not None else None,
                "breakdown": breakdown(r),
            }
        )
    return out


def breakdown(row: dict[str, Any]) -> dict[str, float] | None:
    """A step's seconds split three ways from the interleaved blocks; each part is a difference of two
    measured times, so noise can make one slightly negative: clamped at 0.

    >>> breakdown({"step_seconds": 1.0, "no_sync_step_seconds": 0.8, "compute_step_seconds": 0.6})
    {'compute_seconds': 0.6, 'other_seconds': 0.2, 'exposed_communication_seconds': 0.2}

    On a loaded machine the step without its all-reduce can time slower than the whole step: no communication
    is exposed, and the parts still add up to the step.

    >>> breakdown({"step_seconds": 1.0, "no_sync_step_seconds": 1.1, "compute_step_seconds": 0.6})
    {'compute_seconds': 0.6, 'other_seconds': 0.4, 'exposed_communication_seconds': 0.0}
    """
    compute = row.get("compute_step_seconds")
    if compute is None:
        return None
    without_communication = min(row.get("no_sync_step_seconds") or row["step_seconds"], row["step_seconds"])
    compute = min(compute, without_communication)  # the parts add up to the step
    return {
        "compute_seconds": compute,
        "other_seconds": round(max(0.0, without_communication - compute), 12),
        "exposed_communication_seconds": round(max(0.0, row["step_seconds"] - without_communication), 12),
    }


def fit(rows: list[dict[str, Any]], mode: str) -> dict[str, Any] | None:
    """Amdahl's law fitted to strong-scaling speedups, Gustafson's to weak-scaling ones (JSON form), over
    the world sizes where each process had cores of its own; None with fewer than two of them."""
    speedups = {r["world_size"]: r["speedup"] for r in rows if not r.get("oversubscribed")}
    if len(speedups) < 2:
        return None
    law = scaling_laws.fit_amdahl if mode == "strong" else scaling_laws.fit_gustafson
    return law(speedups).as_dict()


def render(
    rows: list[dict[str, Any]], mode: str, context: str, fitted: dict[str, Any] | None = None, note: str | None = None
) -> str:
    """The table, then (blank-line separated, so Markdown keeps them out of the table) the fit, the step
    breakdown at the largest N and `note`."""
    lines = [
        f"{mode.capitalize()} scaling: {context}.",
        "",
        "| world size | global batch | images/s | images/s per rank | speedup | efficiency | Karp-Flatt e "
        "| communication share |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        karp = "-" if r["karp_flatt"] is None else f"{r['karp_flatt']:.3f}"
        comm = "-" if r["communication_share"] is None else f"{r['communication_share']:.1%}"
        lines.append(
            f"| {r['world_size']} | {r['global_batch_size']} | {r['samples_per_second']:.1f} | "
            f"{r['samples_per_second'] / r['world_size']:.1f} | {r['speedup']:.2f} | "
            f"{r['efficiency']:.1%} | {karp} | {comm} |"
        )
    lines += [
        "",
        "communication share = 1 - (step time under no_sync) / (step time with the all-reduce), interleaved blocks.",
    ]
    if fitted:
        lines += ["", describe_fit(fitted)]
    # the largest world size with cores of its own: past them the split measures turn-taking
    largest = next((r for r in reversed(rows) if not r.get("oversubscribed")), rows[-1])
    if largest.get("breakdown"):
        b = largest["breakdown"]
        lines += [
            "",
            f"A step at N = {largest['world_size']}: forward + backward {b['compute_seconds'] * 1e3:.1f} ms, "
            f"optimizer and the rest {b['other_seconds'] * 1e3:.1f} ms, exposed communication "
            f"{b['exposed_communication_seconds'] * 1e3:.1f} ms (of {largest['step_seconds'] * 1e3:.1f} ms).",
        ]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def describe_fit(fitted: dict[str, Any]) -> str:
    """One paragraph: the fitted fraction, how well it fits, and the projection.

    >>> from lab import scaling_laws
    >>> print(describe_fit(scaling_laws.fit_amdahl({1: 1.0, 2: 1.8, 4: 3.0}).as_dict()))  # doctest: +ELLIPSIS
    Amdahl's law fitted (least squares) to the measured speedups: serial fraction s = 0.111, ... at most 1/s = 9.0x.
    """
    s, law = fitted["serial_fraction"], fitted["law"]
    # JSON keys are text (and written sorted): order them as numbers
    projection = sorted(fitted["projection"].items(), key=lambda item: int(item[0]))
    projected = ", ".join(f"{n}: {p['speedup']:.1f}x ({p['efficiency']:.0%})" for n, p in projection)
    text = (
        f"{law.capitalize()}'s law fitted (least squares) to the measured speedups: serial fraction "
        f"s = {s:.3f}, root-mean-square residual {fitted['residual_rms']:.3f} over {fitted['points']} world sizes. "
        f"Projected speedup (efficiency) at {projected}"
    )
    if law == "amdahl":
        return text + (f"; at most 1/s = {1 / s:.1f}x." if s > 0 else "; no serial part measured.")
    return text + "; weak scaling grows the problem with N, so there is no ceiling."


# ----------------------------------------------------------------------------- the parent


def measure(
    sizes: list[int],
    cfg: Config,
    env: dict[str, str],
    steps: int,
    warmup: int,
    global_batch: Callable[[int], int],
    who: str,
) -> list[dict[str, Any]] | None:
    """Each world size its own torchrun job of this module's worker, one after another; None (its output's tail and
    which size printed) when one fails. `lab predict` measures the same way."""
    from lab.run.cluster import jobs

    results: list[dict[str, Any]] = []
    for n in sizes:
        params = {"steps": steps, "warmup": warmup, "global_batch": global_batch(n)}
        try:
            results += jobs.run(jobs.Job("lab.measure.bench.train.scaling", n, params, cfg, env=env, reports=1))
        except jobs.JobFailed as exc:
            print(exc.tail(), file=sys.stderr)
            print(f"{who}: world size {n} failed: {exc}", file=sys.stderr)
            return None
    return results


def run(args: argparse.Namespace) -> int:
    from lab import plots
    from lab.run import config
    from lab.run.cluster import runner
    from lab.run.training import runs

    if args.plot:
        plots.require()  # matplotlib missing: exit 2 now, not after the measurements
    gpus = cores.gpu_count()
    sizes = world_sizes(args.max_world_size or cores.default_ranks(gpus, cpu_ranks=cores.available()))
    runner.check_processes(sizes[-1], f"--max-world-size {sizes[-1]}")  # before the first world size starts
    gpu = gpus > 0
    args.batch_per_rank = args.batch_per_rank or (256 if gpu else 64)
    args.global_batch = args.global_batch or (2048 if gpu else 128)
    base_overrides = list(args.overrides)
    args.config = args.config or ("workshop-gpu" if gpu else "workshop-cpu")
    cfg = config.load(args.config, base_overrides)
    for n in sizes:
        config.check_layout(config.with_overrides(cfg, train={"global_batch_size": _global_batch(args, n)}), n)
    threads = cores.threads_per_process(sizes[-1])
    # The same threads per process at every N: each rank has the compute of `threads` cores, as each GPU rank has
    # one GPU; more processes do not get more cores each.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    results = measure(sizes, cfg, env, args.steps, args.warmup, lambda n: _global_batch(args, n), "scaling")
    if results is None:
        return 1
    available = cores.available()
    rows = [
        {**r, "oversubscribed": r["device"] == "cpu" and r["world_size"] * threads > available} for r in derive(results)
    ]
    fitted = fit(rows, args.mode)
    device = results[0]["device"]
    context = (
        f"{results[0]['data']}, ResNet-18 width {cfg.model.width}, {device}, {threads} thread(s) per process"
        if device == "cpu"
        else f"{results[0]['data']}, ResNet-18 width {cfg.model.width}, {device}"
    )
    note = oversubscription_note(sizes[-1], threads, available) if device == "cpu" else None
    print(render(rows, args.mode, context, fitted, note), flush=True)
    result = {
        "benchmark": "scaling",
        "mode": args.mode,
        "rows": rows,
        "context": context,
        "note": note,
        "threads_per_process": threads,
        "steps": args.steps,
        "warmup": args.warmup,
        **({fitted["law"]: fitted} if fitted else {}),
    }
    if args.json:
        runs.write_json(args.json, result)
    if args.pushgateway:
        from lab.run.observability import metrics

        metrics.push_scaling(args.pushgateway, runs.new_run_id("scaling"), rows, args.mode)
    if args.plot:
        plots.scaling(rows, args.mode, context, Path(args.plot), fitted)
        print(f"plot: {args.plot}", flush=True)
    return 0


def oversubscription_note(largest: int, threads: int, available: int) -> str | None:
    """What a CPU run past its cores measures, said where it happens.

    >>> oversubscription_note(4, 1, 2)[:39]
    '4 processes x 1 thread(s) need 4 cores;'
    >>> oversubscription_note(2, 1, 2) is None
    True
    """
    if largest * threads <= available:
        return None
    return (
        f"{largest} processes x {threads} thread(s) need {largest * threads} cores; this machine gives "
        f"{available}, so beyond {max(1, available // threads)} processes they take turns on the same "
        f"cores: measured and shown, but left out of the fit (each law assumes a processor per worker). "
        f"On GPUs every rank has its own device."
    )


def world_sizes(largest: int) -> list[int]:
    """1, 2, 4, ... up to `largest`, and `largest` itself: the doublings a scaling law is read from."""
    if largest < 1:
        raise LabError(f"--max-world-size {largest}: need at least 1")
    sizes = [n for n in (2**k for k in range(largest.bit_length())) if n <= largest]
    return sizes if sizes[-1] == largest else [*sizes, largest]


def _global_batch(args: argparse.Namespace, n: int) -> int:
    return args.batch_per_rank * n if args.mode == "weak" else args.global_batch


# ----------------------------------------------------------------------------- one world size (a torchrun worker)


def worker(argv: list[str]) -> None:
    import torch

    from lab.measure.bench.train import harness
    from lab.run.cluster import dist, jobs, provenance

    job = jobs.this_job(argv)
    steps, warmup, global_batch = job.params["steps"], job.params["warmup"], job.params["global_batch"]
    assert job.config is not None  # the parent hands its checked config down
    # Synthetic data sized for the steps, so no epoch boundary interrupts a block.
    cfg = harness.synthetic_config(job.config, global_batch, batches=2 * steps + warmup + 1)
    with harness.trainer_session(cfg) as (ctx, trainer, dataset):
        batches = trainer.train_loader.forever()

        def block(kind: str, steps: int) -> float:
            def train() -> None:
                for _ in range(steps):
                    trainer.train_step(*next(batches), sync=kind == "step")

            def forward_backward() -> None:  # no optimizer, no all-reduce: the compute alone
                for _ in range(steps):
                    trainer.forward_backward(*next(batches), sync=False)

            seconds = harness.timed(ctx, forward_backward if kind == "compute" else train, barrier=True)
            trainer.optimizer.zero_grad(set_to_none=True)  # the compute blocks leave gradients summed up
            return seconds

        block("step", warmup)
        quarter = max(1, steps // 4)
        # Mirror order (A B C C B A): a drift of the machine over the blocks falls on every kind alike.
        # At world size 1 there is no all-reduce to leave out, so no no_sync blocks.
        order = (
            [("step", quarter), ("no_sync", quarter), ("compute", quarter)]
            if ctx.distributed
            else [("step", max(1, steps // 2)), ("compute", quarter)]
        )
        seconds: dict[str, float] = {}
        counted: dict[str, int] = {}
        for kind, steps in [*order, *reversed(order)]:
            seconds[kind] = seconds.get(kind, 0.0) + block(kind, steps)
            counted[kind] = counted.get(kind, 0) + steps
        # Every rank's clock counts: the slowest rank sets the pace.
        per_step = {kind: max(dist.all_gather_object(ctx, seconds[kind] / counted[kind])) for kind in seconds}
        step_seconds, no_sync_seconds = per_step["step"], per_step.get("no_sync")
        gradient_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
        links = _allreduce_seconds(ctx, gradient_bytes) if ctx.distributed else {}
        if ctx.is_primary:
            job.report(
                ctx.global_rank,
                {
                    "world_size": ctx.world_size,
                    "global_batch_size": global_batch,
                    "batch_size_per_rank": trainer.batch_size,
                    "step_seconds": step_seconds,
                    "no_sync_step_seconds": no_sync_seconds,
                    "compute_step_seconds": per_step["compute"],
                    "samples_per_second": global_batch / step_seconds,
                    "communication_share": max(0.0, 1 - no_sync_seconds / step_seconds) if no_sync_seconds else None,
                    "device": provenance.describe(ctx)["device_name"],
                    "data": dataset.description.split(" (")[0],
                    "threads": torch.get_num_threads(),
                    "timed_steps": counted["step"],
                    "gradient_bytes": gradient_bytes,
                    "bucket_cap_mb": job.config.dist.bucket_cap_mb,
                    "other_step_seconds": (no_sync_seconds or step_seconds) - per_step["compute"],
                    **links,
                },
            )


def _allreduce_seconds(ctx: DistContext, gradient_bytes: int, calls: int = 9) -> dict[str, float]:
    """This job's all-reduce alone: one the size of all the gradients and one of 4 bytes, the bandwidth and latency a
    prediction reads (lab.measure.prediction.measured). Each call timed on its own, every rank starting together; the
    median
    of each rank's calls (one call descheduled on a shared machine would swell a mean), then the slowest rank's."""
    import statistics

    import torch

    from lab.measure.bench.train import harness
    from lab.run.cluster import dist

    out = {}
    for key, nbytes in (("allreduce_gradients_seconds", gradient_bytes), ("allreduce_4_bytes_seconds", 4)):
        buffer = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
        dist.all_reduce_sum(ctx, buffer)  # warm-up: the first call sets up the connections

        def once(buffer: torch.Tensor = buffer) -> None:
            dist.all_reduce_sum(ctx, buffer)

        each = [harness.timed(ctx, once, barrier=True) for _ in range(calls)]
        out[key] = max(dist.all_gather_object(ctx, statistics.median(each)))
    return out


if __name__ == "__main__":
    worker(sys.argv[1:])
