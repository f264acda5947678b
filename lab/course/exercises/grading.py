"""Running a learner's file the grader's way, and the checklist it prints.

`observed(file, ranks, args)` runs FILE under torchrun (or alone, ranks=None) through the lab's runner, every rank
watched by lab.course.exercises.observe, with the exercise's seeds and sizes in `args` and a short time limit; it
returns a
Run: how it ended, what it printed, and each rank's trace. A run that hangs is stopped at the limit, every process
with it, and `hang(run)` names the rank that was waiting, in which collective, on which line, and the rank that
never came.

A check (lab.verdict.Check) is one line of the checklist: its name, its verdict (held, failed; not run when what it
measures never happened, as a run that crashed first), what was measured, and (when it did not hold) the likely cause
in the learner's terms.

>>> print(render("demo", [Check("ends cleanly", HELD, "2 ranks in 3.1 s"),
...                       Check("disjoint shards", FAILED, "rank 0 and 1 share 96 of 96 samples", "no sampler"),
...                       Check("one writer", NOT_RUN, "not measured: the run crashed")]))
lab exercise check demo
  [x] ends cleanly: 2 ranks in 3.1 s
  [ ] disjoint shards: rank 0 and 1 share 96 of 96 samples
      -> no sampler
  [-] one writer: not measured: the run crashed
1 of 3 checks hold
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.course.exercises import trace
from lab.run.cluster import child_output, cores, launch, runner
from lab.run.cluster import hang as diagnosis
from lab.verdict import FAILED, HELD, NOT_APPLICABLE, NOT_RUN, Check

OBSERVER = "lab.course.exercises.observe"


@dataclass
class Run:
    label: str  # "2 ranks", "1 process (the reference)"
    world_size: int
    returncode: int
    timed_out: bool
    seconds: float
    output: str
    ranks: list[trace.Rank] = field(default_factory=list)
    timeout_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def backend(self) -> str | None:
        """The process group's backend the ranks used (gloo, nccl), where they started one."""
        found = [e["backend"] for r in self.ranks for e in r.of("init")]
        return found[0] if found else None

    def how_it_ended(self) -> str:
        if self.ok:
            over = f" over {self.backend}" if self.backend else ""
            return f"{self.label}{over} ended cleanly in {self.seconds:.1f} s"
        if self.timed_out:
            return f"{self.label} did not end within {self.timeout_seconds:g} s and was stopped: {hang(self)}"
        error = child_output.last_error_line(self.output) or "no error line"
        if any(r.waiting() for r in self.ranks):  # the collectives first: the error is the backend's on the hang
            return f"{self.label} exited {self.returncode}: {hang(self)} (then: {error[:160]})"
        return f"{self.label} exited {self.returncode}: {error}"


def hang(run: Run) -> str:
    """Who waited in which collective (sequence number, operation, line), who never came or went to another
    collective, who raised or had finished: the lab's own diagnosis of a hang (lab.run.cluster.hang, the words of
    `lab hang`), read from the ranks' traces instead of the Flight Recorder."""
    snapshots: dict[int, dict[str, Any]] = {}
    exits: dict[int, str] = {}
    for r in run.ranks:
        if not r.events:
            exits[r.rank] = "never started"
            continue
        entered = r.collectives()
        waiting = r.waiting()
        last = waiting["seq"] if waiting else (entered[-1]["seq"] if entered else 0)
        errors = r.of("error")
        if errors:
            exits[r.rank] = f"raised {errors[-1]['text']} at {errors[-1]['where']}"
        elif r.ended:
            exits[r.rank] = f"had finished after {len(entered)} collectives"
        snapshots[r.rank] = {
            "groups": {"0": {"enqueued": last, "completed": last - 1 if waiting else last}},
            "entries": [
                {"group": "0", "seq": e["seq"], "op": e["op"], "sizes": e.get("shapes"), "where": _place(e)}
                for e in entered
            ],
            "where": _place(r.events[-1]),
        }
    found = diagnosis.diagnose(snapshots, len(run.ranks), exits)
    if not any(r["state"] in ("waiting", "mismatch") for r in found["ranks"]):
        return "no rank was inside a collective: " + found["summary"]
    return found["summary"]


def _place(event: dict[str, Any]) -> dict[str, Any] | None:
    """An event's "where" (recorder.where: "file.py:12 in main", or a place such as "DDP backward") as a frame."""
    where = event.get("where")
    if not where or where == "?":
        return None
    found = re.match(r"^(.+):(\d+) in (.+)$", where)
    return {"file": found[1], "line": int(found[2]), "function": found[3]} if found else {"text": where}


def device_env(world_size: int) -> dict[str, str]:
    """Each rank a GPU of its own where there are enough (the learner's NCCL path), else none visible (gloo)."""
    env = launch.worker_env(world_size)
    if cores.gpu_count() < world_size:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# The grader's own runs (a reference, the unchanged starter) cannot hang: they get this long however short the
# learner's limit, so a loaded machine (a room's seats grading at once on shared cores) slows a check, never fails it.
REFERENCE_SECONDS = 600.0


def reference_limit(timeout_seconds: float) -> float:
    return max(timeout_seconds, REFERENCE_SECONDS)


def observed(
    file: Path,
    world_size: int | None,
    args: list[str],
    *,
    timeout_seconds: float,
    probe: str | None = None,
    label: str | None = None,
) -> Run:
    """Run `file` watched on `world_size` ranks (None: one plain process, no torchrun) with `args`."""
    n = world_size or 1
    with tempfile.TemporaryDirectory(prefix="lab-exercise-") as tmp:
        target = ["-m", OBSERVER, "--trace", tmp, *(["--probe", probe] if probe else []), str(file), "--", *args]
        command = [sys.executable, *target] if world_size is None else launch.torchrun_command(n, target)
        env = device_env(n)
        env["PYTHONUNBUFFERED"] = "1"
        started = time.monotonic()
        done = runner.run(
            command,
            env=env,
            processes=n,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout_seconds=timeout_seconds,
            echo=False,
        )
        seconds = time.monotonic() - started
        ranks = trace.read(Path(tmp), n)
    return Run(
        label or (f"{n} ranks" if world_size else "1 process"),
        n,
        done.returncode,
        done.timed_out,
        seconds,
        done.stdout,
        ranks,
        timeout_seconds,
    )


OUTPUT_HINT = "read the first error in its output (its last lines are printed above the checklist)"


def ended(run: Run, name: str = "ends cleanly") -> Check:
    if not run.ok:
        show_output(run)
    return Check(name, HELD if run.ok else FAILED, run.how_it_ended(), "" if run.ok else OUTPUT_HINT)


def show_output(run: Run, lines: int = 30) -> None:
    """The last lines of a learner's run that failed, on stderr before the checklist: where its error is."""
    tail = (run.output or "").splitlines()[-lines:]
    print(f"--- {run.label}: the last {len(tail)} lines of its output ---", file=sys.stderr)
    print("\n".join(tail), file=sys.stderr, flush=True)


def render(exercise: str, checks: list[Check]) -> str:
    lines = [f"lab exercise check {exercise}"]
    for c in checks:
        mark = {HELD: "x", NOT_RUN: "-", NOT_APPLICABLE: "x"}.get(c.verdict, " ")
        lines.append(f"  [{mark}] {c.name}: {c.detail}")
        if not c.passes and c.fix:
            lines.append(f"      -> {c.fix}")
    held = sum(c.passes for c in checks)
    lines.append(f"{held} of {len(checks)} checks hold")
    return "\n".join(lines)
