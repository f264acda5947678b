"""Running a learner's file the grader's way, and the checklist it prints.

`observed(file, ranks, args)` runs FILE under torchrun (or alone, ranks=None) through the lab's runner, every rank
watched by lab.exercises.observe, with the exercise's seeds and sizes in `args` and a short time limit; it returns a
Run: how it ended, what it printed, and each rank's trace. A run that hangs is stopped at the limit, every process
with it, and `hang(run)` names the rank that was waiting, in which collective, on which line, and the rank that
never came.

A Check is one line of the checklist: its name, whether it held, what was measured, and (when it failed) the
likely cause in the learner's terms.

>>> print(render("demo", [Check("ends cleanly", True, "2 ranks in 3.1 s"),
...                       Check("disjoint shards", False, "rank 0 and 1 share 96 of 96 samples", "no sampler")]))
lab exercise check demo
  [x] ends cleanly: 2 ranks in 3.1 s
  [ ] disjoint shards: rank 0 and 1 share 96 of 96 samples
      -> no sampler
1 of 2 checks hold
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lab.cluster import cores, launch, runner
from lab.exercises import trace

OBSERVER = "lab.exercises.observe"


@dataclass
class Check:
    name: str
    held: bool
    measured: str
    hint: str = ""  # the likely cause, in the learner's terms; shown when the check fails

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        error = runner.last_error_line(self.output) or "no error line"
        stuck = hang(self) if any(r.waiting() for r in self.ranks) else ""
        return f"{self.label} exited {self.returncode}: {error}" + (f" ({stuck})" if stuck else "")


def hang(run: Run) -> str:
    """Who waited in which collective (sequence number, operation, line) and who never came, from the traces."""
    waiting, elsewhere = [], []
    for r in run.ranks:
        w = r.waiting()
        errors = r.of("error")
        if w:
            waiting.append(f"rank {r.rank} waiting in {w['op']} #{w['seq']} ({w['where']})")
        elif errors:
            elsewhere.append(f"rank {r.rank} raised {errors[-1]['text']} ({errors[-1]['where']})")
        elif r.ended:
            elsewhere.append(f"rank {r.rank} had finished after {len(r.collectives())} collectives")
        elif not r.events:
            elsewhere.append(f"rank {r.rank} never started")
        else:
            last = r.collectives()
            after = f" after {last[-1]['op']} #{last[-1]['seq']}" if last else ""
            elsewhere.append(f"rank {r.rank} was not in a collective{after}")
    if not waiting:
        return "no rank was inside a collective: " + "; ".join(elsewhere) if elsewhere else "no trace"
    return "; ".join(waiting + elsewhere)


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


def ended(run: Run, name: str = "ends cleanly") -> Check:
    return Check(
        name,
        run.ok,
        run.how_it_ended(),
        "" if run.ok else "read the first error above it in the output (lab exercise check --verbose shows it all)",
    )


def render(exercise: str, checks: list[Check]) -> str:
    lines = [f"lab exercise check {exercise}"]
    for c in checks:
        lines.append(f"  [{'x' if c.held else ' '}] {c.name}: {c.measured}")
        if not c.held and c.hint:
            lines.append(f"      -> {c.hint}")
    held = sum(c.held for c in checks)
    lines.append(f"{held} of {len(checks)} checks hold")
    return "\n".join(lines)
