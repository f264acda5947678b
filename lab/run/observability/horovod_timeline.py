"""Horovod's timeline of a run (runs/<id>/horovod-timeline.json, dist.horovod_timeline_steps), summarised by phase.

Horovod writes Chrome's trace format: one "process" per tensor (allreduce.layer1.0.conv1.weight, ...), and on
it the phases each all-reduce went through, as begin/end pairs:

- NEGOTIATE_ALLREDUCE: from this rank's gradient being ready to every rank having it ready (the coordinator's
  round: the wait for the slowest rank's backward);
- ALLREDUCE: the operation itself, around MEMCPY_IN_FUSION_BUFFER (small tensors copied into the one fusion
  buffer), GLOO_ALLREDUCE or NCCL_ALLREDUCE (the collective, once for every tensor fused into it) and
  MEMCPY_OUT_FUSION_BUFFER (copied back).

Fused tensors go through one collective, each with its own span, so summing spans over tensors counts one
all-reduce as many times as it fused tensors: the wall time of a phase here is the union of its spans (the
time during which any tensor was in it). Horovod leaves the file's closing bracket off while it records, so
a file cut short by a crash still reads.

>>> events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "allreduce.a"}},
...           {"ph": "B", "name": "ALLREDUCE", "ts": 0, "pid": 1}, {"ph": "E", "ts": 10, "pid": 1},
...           {"ph": "B", "name": "ALLREDUCE", "ts": 0, "pid": 2}, {"ph": "E", "ts": 10, "pid": 2},
...           {"ph": "B", "name": "ALLREDUCE", "ts": 20, "pid": 1}, {"ph": "E", "ts": 25, "pid": 1}]
>>> phase = summarise_events(events)["phases"]["ALLREDUCE"]
>>> phase["tensor_spans"], phase["operations"], phase["wall_us"]
(3, 2, 15)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE = "horovod-timeline.json"  # in the run directory (lab.run.training.strategies.horovod writes it)

WHAT = {
    "NEGOTIATE_ALLREDUCE": "waiting until every rank has the gradient (the slowest backward)",
    "ALLREDUCE": "the all-reduce, copies included",
    "MEMCPY_IN_FUSION_BUFFER": "copying small gradients into the fusion buffer",
    "GLOO_ALLREDUCE": "the collective on gloo",
    "NCCL_ALLREDUCE": "the collective on NCCL",
    "MEMCPY_OUT_FUSION_BUFFER": "copying the sums back out",
    "INIT_FUSION_BUFFER": "allocating the fusion buffer (once)",
}


def read(path: Path) -> list[dict[str, Any]]:
    text = Path(path).read_text().strip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    return json.loads(text)


def _union(spans: set[tuple[int, int]]) -> int:
    total, end = 0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total, end = total + stop - start, stop
        elif stop > end:
            total, end = total + stop - end, stop
    return total


def summarise_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    # keyed by pid; an event without one (never seen from Horovod) shares the None key, so it is not dropped
    open_spans: dict[int | None, list[tuple[str, int]]] = {}
    spans: dict[str, set[tuple[int, int]]] = {}
    counts: dict[str, int] = {}
    tensors = set()
    for e in events:
        pid, ph = e.get("pid"), e.get("ph")
        if ph == "M" and e.get("name") == "process_name" and "name" in e.get("args", {}):
            tensors.add(e["args"]["name"])
        elif ph == "B":
            open_spans.setdefault(pid, []).append((e["name"], e["ts"]))
        elif ph == "E" and open_spans.get(pid):
            name, start = open_spans[pid].pop()
            spans.setdefault(name, set()).add((start, e["ts"]))
            counts[name] = counts.get(name, 0) + 1
    phases = {
        name: {
            "tensor_spans": counts[name],
            "operations": len(spans[name]),
            "wall_us": _union(spans[name]),
            "what": WHAT.get(name, ""),
        }
        for name in spans
    }
    every = set().union(*spans.values()) if spans else set()
    return {
        "tensors": len(tensors),
        "phases": phases,
        "span_us": (max(s for _, s in every) - min(s for s, _ in every)) if every else 0,
    }


def summarise(path: Path, steps: int) -> dict[str, Any]:
    """The timeline at `path` by phase, over `steps` recorded optimizer steps."""
    return {**summarise_events(read(path)), "steps": steps, "file": Path(path).name}


def render(summary: dict[str, Any], run: str) -> list[str]:
    """Markdown lines for the report: one row per phase, in the order an all-reduce goes through them."""
    order = [name for name in WHAT if name in summary["phases"]] + sorted(set(summary["phases"]) - set(WHAT))
    span = max(1, summary["span_us"])
    lines = [
        f"Horovod timeline of {run} ({summary['file']}: {summary['tensors']} tensors over the first "
        f"{summary['steps']} steps, {span / 1e3:.0f} ms; open it in ui.perfetto.dev or chrome://tracing):",
        "",
        "| phase | what it is | tensors through it | wall ms | share of the recorded time |",
        "|---|---|---:|---:|---:|",
    ]
    for name in order:
        p = summary["phases"][name]
        lines.append(
            f"| {name} | {p['what']} | {p['tensor_spans']} | {p['wall_us'] / 1e3:.1f} | {p['wall_us'] / span:.0%} |"
        )
    fused, reduced = (
        summary["phases"].get(k, {}).get("tensor_spans", 0) for k in ("MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE")
    )
    if reduced:
        lines += [
            "",
            f"Tensor fusion: {fused} of {reduced} gradient all-reduces went through the fusion buffer "
            f"(small tensors reduced together, HOROVOD_FUSION_THRESHOLD); the rest went alone.",
        ]
    return lines + [""]
