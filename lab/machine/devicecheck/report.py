"""The device check's closing table: one line a step with its verdict and detail, the verdicts counted, and the exit
code its outcomes make (0 held or not applicable, 1 a step failed, 4 incomplete: a step not run)."""

from __future__ import annotations

from typing import Any

from lab.errors import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK
from lab.machine.devicecheck.harness import Outcome
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, NOT_RUN, overall


def render(r: dict[str, Any]) -> str:
    """The table printed last: the device and its versions, one line a step, the verdicts counted."""
    v = r["versions"]
    head = (
        f"# lab gpu-check: {r['device']} x {r['gpus']}; driver {v.get('driver')}, CUDA {v.get('cuda')}, "
        f"NCCL {v.get('nccl')}, torch {v.get('torch')}"
        if r["gpu"]
        else f"# lab gpu-check: no GPU (CPU, torch {v.get('torch')})" + (", toy sizes" if r["quick"] else "")
    )
    steps = r["steps"]
    width = max(len(s["step"]) for s in steps)
    lines = [head, *(f"{s['step'].ljust(width)}  {s['verdict']:<14}  {s['detail']}" for s in steps)]
    count = {v: sum(s["verdict"] == v for s in steps) for v in (HELD, FAILED, NOT_RUN, NOT_APPLICABLE)}
    late = sum(s["verdict"] == NOT_RUN and s.get("by_deadline", False) for s in steps)
    said = ", ".join(f"{n} {v}" for v, n in count.items() if n)
    verdict = overall(s["verdict"] for s in steps)
    summary = {
        FAILED: "failed",
        NOT_RUN: "incomplete",
        HELD: "held",
        NOT_APPLICABLE: "nothing checked: no step applies here",
    }[verdict]
    deadline = f"; {late} not run: the {r['deadline_seconds']} s deadline was spent" if late else ""
    return "\n".join([*lines, f"gpu-check: {summary} ({said} of {len(steps)} step(s)){deadline}"])


def exit_code(outcomes: list[Outcome]) -> int:
    """1 when a step failed; 4 (incomplete) when none failed and one was not run, said on one line; else 0."""
    verdict = overall(o.verdict for o in outcomes)
    if verdict == FAILED:
        return EXIT_FAILED
    if verdict == NOT_RUN:
        not_run = [o for o in outcomes if o.verdict == NOT_RUN]
        named = "; ".join(f"{o.step}: {o.detail}" for o in not_run)
        print(f"gpu-check: incomplete: {len(not_run)} step(s) not run, so the check does not pass ({named})")
        return EXIT_INCOMPLETE
    return EXIT_OK
