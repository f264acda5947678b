"""The device check's plan: which steps this host runs, each one's expected seconds, and the deadline they fit in.

A step the host's hardware cannot run (no GPU, fewer GPUs than it needs) is not applicable and says why. A step left
out otherwise (not asked for with --only, a package missing, no room left in a deadline given by hand) is not run,
and a check with a step not run is incomplete: it cannot pass (lab.verdict). By default the deadline is made to fit
every step the hardware allows: the steps' expected seconds on this host (some grow with its GPUs) over
PLAN_SHARE, so a quarter of it stays as slack for a cold compile or a slow disk.

>>> deadline_for([Step("a", 30, 10, run=lambda h: []), Step("b", 10, 5, run=lambda h: [], per_gpu=10)], gpus=8)
160
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.machine.devicecheck.harness import HOW_TO_GET, STEP_LIMIT, Harness, Outcome
from lab.verdict import NOT_APPLICABLE, NOT_RUN

# The plan keeps to this share of the deadline: a step's seconds on another host, a cold compile or a slow disk
# must find slack, not cut the check short on a healthy machine.
PLAN_SHARE = 0.75


@dataclass(frozen=True)
class Step:
    """One row of the check: the line(s) it reports, its expected seconds, what it needs, the function."""

    name: str
    seconds: int  # expected on one H200 (process starts included), plus per_gpu for each GPU of the host
    quick_seconds: int  # expected with --quick: toy sizes on a 2-core CPU (on the GPU for GPU steps)
    run: Callable[[Harness], Outcome | list[Outcome]]
    gpus: int = 0  # GPUs it needs (1: CUDA only; 2: more than one)
    no_gpu: str = ""  # why it cannot run on a CPU, when gpus > 0
    ranks: int = 0  # GPUs it needs on a GPU host, where a CPU runs it on as many processes (--allow-cpu)
    few_gpus: str = "the 1-rank DDP steps ran NCCL"  # what a host with fewer GPUs than it needs still ran, or why
    needs: tuple[str, ...] = ()  # modules without which it cannot run (it is then not run, saying so)
    optional: tuple[tuple[str, str], ...] = ()  # (module, what is left out without it): it runs, smaller
    limit: int = STEP_LIMIT  # seconds each of its children may take at most
    lines: tuple[str, ...] = ()  # the table's lines, when more than its name
    per_gpu: int = 0  # more expected seconds for each GPU of the host (a job per world size, a collective over all)

    @property
    def names(self) -> tuple[str, ...]:
        return self.lines or (self.name,)

    def expected_seconds(self, quick: bool, gpus: int) -> int:
        return self.quick_seconds if quick else self.seconds + self.per_gpu * gpus


def missing(module: str) -> bool:
    """True when `module` cannot be found (a finder that refuses it, as a bare interpreter's, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def not_applicable(step: Step, h: Harness) -> str | None:
    """Why this host's hardware cannot run `step` (no GPU, too few), or None."""
    if step.gpus and not h.gpu:
        return step.no_gpu
    needed = max(step.gpus, step.ranks if h.gpu else 0)
    if h.gpus < needed:
        return f"{h.gpus} GPU on this host: {step.name} needs {needed} or more ({step.few_gpus})"
    return None


def lacking(step: Step) -> str | None:
    """Which package `step` needs that this interpreter lacks, and how to get it, or None."""
    absent = [m for m in step.needs if missing(m)]
    if absent:
        return "needs " + "; ".join(f"{m} ({HOW_TO_GET.get(m, f'pip install {m}')})" for m in absent)
    return None


def deadline_for(steps: tuple[Step, ...] | list[Step], gpus: int, quick: bool = False) -> int:
    """The deadline that holds every step of `steps` within PLAN_SHARE of it, in whole seconds."""
    return math.ceil(sum(s.expected_seconds(quick, gpus) for s in steps) / PLAN_SHARE)


def plan(
    h: Harness, steps: tuple[Step, ...], only: list[str] | None = None, deadline: float | None = None
) -> list[dict[str, Any]]:
    """Each step with its expected seconds, or the verdict it gets without running and why (not applicable: the
    hardware; not run: --only, a missing package, the deadline); what it runs without. The steps are kept in the
    table's order while their sum stays within PLAN_SHARE of `deadline`; one that does not fit is not run, saying
    which deadline would take it in."""
    rows = []
    left_out: dict[str, tuple[str, str] | None] = {}
    for step in steps:
        hardware = not_applicable(step, h)
        other = "not asked for (--only)" if only and step.name not in only else lacking(step)
        left_out[step.name] = (NOT_APPLICABLE, hardware) if hardware else (NOT_RUN, other) if other else None
    runnable = [s for s in steps if left_out[s.name] is None]
    budget, planned = (PLAN_SHARE * deadline if deadline else float("inf")), 0.0
    for step in steps:
        verdict_why = left_out[step.name]
        seconds = step.expected_seconds(h.quick, h.gpus)
        if verdict_why is None and planned + seconds > budget:
            verdict_why = (
                NOT_RUN,
                f"left out to keep the plan within {PLAN_SHARE:.0%} of the {deadline:.0f} s deadline; "
                f"--deadline {deadline_for(runnable, h.gpus, h.quick)} runs every step (or leave --deadline out)",
            )
        planned += 0 if verdict_why else seconds
        without = (
            []
            if verdict_why
            else [
                f"{m}: {what} left out ({HOW_TO_GET.get(m, f'pip install {m}')})"
                for m, what in step.optional
                if missing(m)
            ]
        )
        rows.append(
            {
                "step": step.name,
                "expected_seconds": 0 if verdict_why else seconds,
                "left_out": verdict_why[0] if verdict_why else None,  # its verdict without running; None: planned
                "why": verdict_why[1] if verdict_why else None,
                "without": without,
            }
        )
    return rows


def render_plan(rows: list[dict[str, Any]], deadline: float, quick: bool) -> str:
    total = sum(r["expected_seconds"] for r in rows)
    where = "at toy sizes on a 2-core CPU" if quick else "on one H200"
    width = max(len(r["step"]) for r in rows)
    lines = [
        f"gpu-check plan: {sum(not r['left_out'] for r in rows)} step(s), about {total} s expected ({where}) "
        f"of the {deadline:.0f} s deadline"
    ]
    for r in rows:
        what = f"{r['left_out']}: {r['why']}" if r["left_out"] else f"{r['expected_seconds']:>4} s"
        lines.append(f"  {r['step'].ljust(width)}  {what}" + "".join(f"; without {w}" for w in r["without"]))
    return "\n".join(lines)
