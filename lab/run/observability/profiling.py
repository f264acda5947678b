"""A torch.profiler trace of a few training steps, and what it says about compute vs communication.

    lab train --config ddp --nproc-per-node 2 --profile
    # runs/<id>/trace-rank0.json ... open in https://ui.perfetto.dev or chrome://tracing

Each rank writes its own Chrome/Perfetto trace. In it, DDP's bucketed all-reduces
(gloo or NCCL) run while backward still computes the earlier layers' gradients; rank 0
also writes profile-summary.json: time in communication operations vs everything else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab import atomic

if TYPE_CHECKING:  # types only: torch.profiler is imported inside profiler(), when a run asks for a trace
    from torch.autograd.profiler_util import EventList, FunctionEventAvg
    from torch.profiler import profile

    from lab.run.cluster.dist import DistContext
    from lab.run.training.console import Console

COMMUNICATION = ("allreduce", "all_reduce", "nccl", "gloo", "broadcast", "record_param_comms", "c10d")
WAIT, WARMUP = 1, 2  # steps skipped, then steps profiled but discarded (allocator and caches settle)


def profiler(steps: int, ctx: DistContext, run_dir: Path, console: Console) -> profile:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])

    def ready(prof: profile) -> None:
        trace = run_dir / f"trace-rank{ctx.global_rank}.json"
        with atomic.replacing(trace) as tmp:  # a rank killed mid-export leaves no half trace for the report to link
            prof.export_chrome_trace(str(tmp))
        if ctx.is_primary:
            summary = summarize(prof.key_averages(), steps, ctx.device.type == "cuda")
            summary["trace"] = trace.name
            atomic.write_text(run_dir / "profile-summary.json", json.dumps(summary, indent=2) + "\n")
            console.say(
                f"profile: {trace} ({steps} steps); communication {summary['communication_share']:.1%} "
                f"of profiled operator time"
            )

    return profile(
        activities=activities,
        schedule=schedule(wait=WAIT, warmup=WARMUP, active=steps, repeat=1),
        on_trace_ready=ready,
        record_shapes=False,
    )


def summarize(events: EventList, steps: int, cuda: bool) -> dict[str, Any]:
    """Self time of communication operators vs all others (device time on GPUs, CPU time otherwise)."""

    def self_time(e: FunctionEventAvg) -> float:
        if cuda:
            return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
        return e.self_cpu_time_total

    communication = compute = 0.0
    top: list[tuple[str, float]] = []
    for e in events:
        t = self_time(e)
        if any(k in e.key.lower() for k in COMMUNICATION):
            communication += t
        else:
            compute += t
        top.append((e.key, t))
    top.sort(key=lambda kv: -kv[1])
    total = communication + compute
    return {
        "steps": steps,
        "clock": "device" if cuda else "cpu",
        "compute_us": compute,
        "communication_us": communication,
        "communication_share": communication / total if total else 0.0,
        "top_operators_us": dict(top[:10]),
    }
