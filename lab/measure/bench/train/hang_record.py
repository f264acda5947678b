"""What recording every collective costs (the Flight Recorder, or the lab's Python record on torch < 2.8, and
each rank's watchdog thread): DDP training steps and small all-reduces with the record on vs off.

    lab bench hang-record --config smoke --nproc-per-node 2 --rounds 2 --steps 20

The Flight Recorder is read once per process (its buffer size, at the first process group), so each side is a
torchrun job of its own; jobs alternate ABBA, on the same machine. "off" is LAB_FLIGHT_RECORDER=0 and
dist.hang_seconds=0 (no record, no watchdog). Two figures, each a ratio of means on / off: a training step (the
cost a run pays; goal: at most 1%, so it stays on by default) and one all-reduce of 4 bytes (the worst case: the
record's own per-call work, with nothing to hide it behind).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

GOAL = 1.01  # ratio of step times, on / off


def run(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import harness
    from lab.run import config
    from lab.run.cluster import flight, jobs, launch
    from lab.run.training import runs

    nproc = args.nproc_per_node or 2
    cfg = config.load(args.config or "smoke", args.overrides)
    cfg = harness.synthetic_config(cfg, cfg.train.global_batch_size, batches=args.steps + 4)
    sides: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for recording in harness.abba(args.rounds):
        side = config.with_overrides(cfg, dist={"hang_seconds": cfg.dist.hang_seconds if recording else 0.0})
        env = {**launch.worker_env(nproc), flight.SWITCH_ENV: "1" if recording else "0"}
        job = jobs.Job(
            "lab.measure.bench.train.hang_record",
            nproc,
            params={"steps": args.steps, "calls": args.calls},
            config=side,
            env=env,
            timeout_seconds=600,
            reports=1,
        )
        report = jobs.run(job)[0]
        sides[recording].append(report)
        print(
            f"  {'on ' if recording else 'off'}: {report['step_seconds'] * 1e3:8.2f} ms a step, "
            f"{report['allreduce_seconds'] * 1e6:8.1f} us a 4-byte all-reduce ({report['source'] or 'no record'})",
            flush=True,
        )
    result = summarize(sides, args, nproc)
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    return 0


def summarize(sides: dict[bool, list[dict[str, Any]]], args: argparse.Namespace, nproc: int) -> dict[str, Any]:
    on, off = sides[True], sides[False]

    def ratio(key: str) -> float:
        return statistics.mean(r[key] for r in on) / statistics.mean(r[key] for r in off)

    step_ratio = ratio("step_seconds")
    return {
        "benchmark": "hang-record",
        "world_size": nproc,
        "rounds": args.rounds,
        "steps": args.steps,
        "calls": args.calls,
        "record": on[0]["source"],
        "backend": on[0]["backend"],
        "recorded_ops": on[0]["recorded_ops"],
        "watchdog": on[0]["watchdog"],
        "step_seconds_on": [r["step_seconds"] for r in on],
        "step_seconds_off": [r["step_seconds"] for r in off],
        "allreduce_seconds_on": [r["allreduce_seconds"] for r in on],
        "allreduce_seconds_off": [r["allreduce_seconds"] for r in off],
        "step_ratio_on_over_off": step_ratio,
        "allreduce_ratio_on_over_off": ratio("allreduce_seconds"),
        "device": on[0]["device"],
        "goal_met": step_ratio <= GOAL,
    }


def render(r: dict[str, Any]) -> str:
    goal = "met" if r["goal_met"] else "missed"
    return (
        f"hang record ({r['record']}), {r['world_size']} ranks on {r['device']}, time on / off: a training step "
        f"{r['step_ratio_on_over_off']:.3f} (goal <= {GOAL}: {goal}), a 4-byte all-reduce "
        f"{r['allreduce_ratio_on_over_off']:.3f}"
    )


def worker(argv: list[str]) -> None:
    import torch

    from lab.measure.bench.train import harness
    from lab.run.cluster import dist, flight, jobs, provenance

    job = jobs.this_job(argv)
    assert job.config is not None
    steps, calls = job.params["steps"], job.params["calls"]
    with harness.trainer_session(job.config) as (ctx, trainer, _):
        batches = trainer.train_loader.forever()
        for _ in range(3):  # warm-up: the first steps build DDP's buckets
            trainer.train_step(*next(batches))

        def train() -> None:
            for _ in range(steps):
                trainer.train_step(*next(batches))

        step_seconds = harness.timed(ctx, train, barrier=True) / steps
        tiny = torch.ones(1, device=ctx.device)

        def reduce() -> None:
            for _ in range(calls):
                dist.all_reduce_sum(ctx, tiny)

        # timed to the device's end: on NCCL a call returns when enqueued, so the host's clock alone would time
        # the launches, not the all-reduces
        allreduce_seconds = harness.timed(ctx, reduce, barrier=True) / calls
        gathered = dist.all_gather_object(ctx, (step_seconds, allreduce_seconds))
        slowest = (max(g[0] for g in gathered), max(g[1] for g in gathered))  # the slowest rank sets the pace
        if ctx.is_primary:
            held = flight.snapshot("the benchmark's end")  # what the record holds: on a GPU, NCCL's collectives
            job.report(
                0,
                {
                    "step_seconds": slowest[0],
                    "allreduce_seconds": slowest[1],
                    "source": flight.recording(),
                    "watchdog": ctx.watch is not None,
                    "backend": ctx.backend,
                    "recorded_ops": sorted({e["op"] for e in held["entries"]}),
                    "device": provenance.describe(ctx)["device_name"],
                },
            )


if __name__ == "__main__":
    worker(sys.argv[1:])
