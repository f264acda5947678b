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

import io
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lab.course.exercises import mistakes, on_queue, stacks, trace
from lab.run.cluster import child_output, cores, gpu_queue, launch, runner
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
    stalled: bool = False  # stopped before its limit: no rank's trace moved for STALL_SECONDS, one in a collective
    still_moving: bool = False  # stopped at its limit while its ranks' traces still moved: slow (a loaded machine)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def backend(self) -> str | None:
        """The process group's backend the ranks used (gloo, nccl), where they started one."""
        found = [e["backend"] for r in self.ranks for e in r.of("init")]
        return found[0] if found else None

    @property
    def hung(self) -> bool:
        """Stopped at its limit, or a rank left inside a collective that not every rank reached (a peer that
        finished or went elsewhere: the backend's error is the consequence). Every rank in the same collective,
        which raised (a barrier after destroy_process_group), is that collective's error, not a hang."""
        if self.timed_out:
            return not self.still_moving
        waits = [r.waiting() for r in self.ranks]
        if not any(waits):
            return False
        return len({(w["seq"], w["op"]) if w else None for w in waits}) > 1  # one elsewhere, or in another

    def how_it_ended(self) -> str:
        if self.ok:
            over = f" over {self.backend}" if self.backend else ""
            return f"{self.label}{over} ended cleanly in {self.seconds:.1f} s"
        if self.stalled:
            return f"{self.label} made no progress for {STALL_SECONDS:g} s and was stopped: {hang(self)}"
        if self.timed_out and self.still_moving:
            return (
                f"{self.label} was still running when its {self.timeout_seconds:g} s limit stopped it (every rank "
                f"alive, its collectives still moving: slow, not hung)"
            )
        if self.timed_out:
            return f"{self.label} did not end within {self.timeout_seconds:g} s and was stopped: {hang(self)}"
        error = child_output.last_error_line(self.output) or "no error line"
        if self.hung:  # the collectives first: the error is the backend's on the hang
            return f"{self.label} exited {self.returncode}: {hang(self)} (then: {error[:160]})"
        return f"{self.label} exited {self.returncode}: {error}"


def hang(run: Run) -> str:
    """Who waited in which collective (sequence number, operation, line), who never came or went to another
    collective, who raised or had finished: the lab's own diagnosis of a hang (lab.run.cluster.hang, the words of
    `lab hang`), read from the ranks' traces instead of the Flight Recorder."""
    found = diagnosed(run.ranks)
    if not any(r["state"] in ("waiting", "mismatch") for r in found["ranks"]):
        return "no rank was inside a collective: " + found["summary"]
    return found["summary"]


def crossed(ranks: list[trace.Rank]) -> bool:
    """Every rank inside a collective, not all in the same one at the same number (the diagnosis's mismatch: a
    barrier where the others are in an all-reduce): none of them can ever leave, however recently each arrived, so a
    run its limit stopped there hung; it was not slow."""
    states = {r["state"] for r in diagnosed(ranks)["ranks"]}
    return "mismatch" in states and states <= {"waiting", "mismatch"}


def diagnosed(ranks: list[trace.Rank]) -> dict[str, Any]:
    """lab.run.cluster.hang's diagnosis of the ranks' traces, each trace made the snapshot `lab hang` reads."""
    snapshots: dict[int, dict[str, Any]] = {}
    exits: dict[int, str] = {}
    for r in ranks:
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
            "where": _place({"where": r.stack} if r.stack else r.events[-1]),
        }
    return diagnosis.diagnose(snapshots, len(ranks), exits)


def _place(event: dict[str, Any]) -> dict[str, Any] | None:
    """An event's "where" (recorder.where: "file.py:12 in main", or a place such as "DDP backward") as a frame."""
    where = event.get("where")
    if not where or where == "?":
        return None
    found = re.match(r"^(.+):(\d+) in (.+)$", where)
    return {"file": found[1], "line": int(found[2]), "function": found[3]} if found else {"text": where}


def device_env(world_size: int) -> dict[str, str]:
    """Each rank a GPU of its own where the seat has enough (the learner's NCCL path); else none visible (gloo),
    unless the room's queue lends them (gpu_queue.on_leased)."""
    env = launch.worker_env(world_size)
    if cores.gpu_count() < world_size:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# The grader's own runs (a reference, the unchanged starter) cannot hang: they get this long however short the
# learner's limit, so a loaded machine (a room's seats grading at once on shared cores) slows a check, never fails it.
REFERENCE_SECONDS = 600.0


def reference_limit(timeout_seconds: float) -> float:
    return max(timeout_seconds, REFERENCE_SECONDS)


# A run is stopped as hung, before its limit, once no rank's trace has moved for this long while one of them waits in a
# collective: the exercises' runs take seconds, so a hang is graded in half a minute, not at the limit.
STALL_SECONDS = 30.0
# A run its limit stopped while its traces still moved at their own pace (within 3 of its usual gaps between moves,
# at least PROGRESS_FLOOR and at most PROGRESS_SECONDS ago), every rank alive and the ranks not in crossed collectives
# (crossed), was slow, not hung: a room's seats grading at once share the cores, and correct code that ran out
# of time is not the learner's hang.
PROGRESS_FLOOR = 3.0
PROGRESS_SECONDS = 10.0
ASK_BEFORE_LIMIT = 1.0  # seconds before a run's limit at which its ranks' stacks are asked (the stop follows at once)


class Stall:
    """runner.run's stop_when for a watched run: True once the traces in `folder` have not grown for `seconds` and
    a rank is inside a collective (it entered and never left). A rank computing with no collective pending is never
    a stall, however long it takes (the limit decides)."""

    def __init__(
        self, folder: Path, world_size: int, seconds: float | None = None, limit_seconds: float | None = None
    ) -> None:
        self.folder, self.world_size, self.seconds = folder, world_size, seconds or STALL_SECONDS
        self.fired = False
        self._sizes: dict[str, int] | None = None  # each rank's trace file's size at the last look (None: no look)
        self._moved: dict[str, float] = {}  # each rank's trace: when it last grew after the first look
        self._gaps: list[float] = []  # seconds between the traces' moves (any rank's), as seen
        self._looked = self._since = time.monotonic()  # the last look, and the last move (or the start)
        # Just before the runner's limit stops the run, each rank's stack is asked too: a rank that is in no
        # collective (computing, or stuck in torch's teardown) is then named at its line.
        self._ask_at = None if limit_seconds is None else self._since + max(0.0, limit_seconds - ASK_BEFORE_LIMIT)

    def moving(self) -> bool:
        """Every rank's trace grew lately, at the run's own pace, as of the last look (the stop follows it; its
        teardown is not the run's): within 3 of the usual gaps between moves (the median), at least PROGRESS_FLOOR
        and at most PROGRESS_SECONDS before it. A hang stops a rank's trace (the one waiting), however busy another
        rank is."""
        if len(self._moved) < self.world_size:
            return False
        usual = sorted(self._gaps)[len(self._gaps) // 2] if self._gaps else 0.0
        window = min(PROGRESS_SECONDS, max(PROGRESS_FLOOR, 3 * usual))
        return all(self._looked - moved < window for moved in self._moved.values())

    def __call__(self) -> bool:
        sizes = {p.name: p.stat().st_size for p in self.folder.glob("rank-*.jsonl")}
        now = self._looked = time.monotonic()
        grown = [] if self._sizes is None else [r for r, n in sizes.items() if n != self._sizes.get(r, -1)]
        first, self._sizes = self._sizes is None, sizes
        if self._ask_at is not None and now >= self._ask_at:
            self._ask_at = None
            stacks.ask(self.folder, {r.rank: r.pid for r in trace.read(self.folder, self.world_size) if r.pid})
        if grown:
            if self._moved:
                self._gaps.append(now - max(self._moved.values()))
            self._moved.update(dict.fromkeys(grown, now))
        if first or grown:
            self._since = now
            return False
        if now - self._since < self.seconds:
            return False
        ranks = trace.read(self.folder, self.world_size)
        self.fired = any(r.waiting() for r in ranks)
        if self.fired:  # where each rank is, C++ included, before the stop (a SIGTERM handler runs no sooner)
            stacks.ask(self.folder, {r.rank: r.pid for r in ranks if r.pid})
        return self.fired


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
    with (
        on_queue.gpus_for(world_size, timeout_seconds) as leased,
        tempfile.TemporaryDirectory(prefix="lab-exercise-", dir=on_queue.trace_root(leased)) as tmp,
    ):
        target = ["-m", OBSERVER, "--trace", tmp, *(["--probe", probe] if probe else []), str(file), "--", *args]
        command = [sys.executable, *target] if world_size is None else launch.torchrun_command(n, target)
        env = device_env(n)
        if leased is not None:  # on the leased GPUs (a Slurm lease: a step of its allocation)
            command, env = gpu_queue.on_leased(leased, command, env)
        env["PYTHONUNBUFFERED"] = "1"
        started = time.monotonic()  # after the queue's wait: a run's limit counts from its start on its GPUs
        stall = Stall(Path(tmp), n, limit_seconds=timeout_seconds)
        done = runner.run(
            command,
            env=env,
            processes=n,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout_seconds=timeout_seconds,
            echo=False,
            stop_when=stall,
        )
        seconds = time.monotonic() - started
        moving = done.timed_out and not stall.fired and stall.moving()
        ranks = trace.read(Path(tmp), n)
        alive = all(r.events and not r.ended and not r.of("error") for r in ranks)
        still_moving = moving and alive and not crossed(ranks)
    run = Run(
        label or (f"{n} ranks" if world_size else "1 process"),
        n,
        done.returncode,
        done.timed_out,
        seconds,
        done.stdout,
        ranks,
        timeout_seconds,
        stall.fired,
        still_moving,
    )
    on_queue.say_if_unused(leased, run.backend, run.label)
    return run


def each_world(worlds: tuple[int, ...], run_on: Callable[[int], Run]) -> tuple[dict[int, Run], list[Check]]:
    """The learner's file on each world size in turn; after one that hung, the next are not started (a hang is the
    learner's at any size, and each would cost the whole limit again): each is a "not run" line naming the hang."""
    runs: dict[int, Run] = {}
    skipped: list[Check] = []
    for n in worlds:
        hung = next((m for m, run in runs.items() if run.timed_out), None)
        if hung is not None:
            how = "ran past its limit" if runs[hung].still_moving else "hung"
            skipped.append(Check(f"runs on {n} ranks", NOT_RUN, f"not run: it {how} on {hung} ranks"))
            continue
        runs[n] = run_on(n)
    return runs, skipped


OUTPUT_HINT = "read the first error in its output (its last lines are printed above the checklist)"
HANG_HINT = (
    "every rank must make the same collectives, in the same order, with the same sizes: the line above names the "
    "rank that waited, in which collective and on which line, and where the one that never came was"
)


SLOW_HINT = (
    "nothing hung: the run needed more than its limit here (a busy machine: a room's seats share the cores); check "
    "again with a longer one, --timeout S (a real hang is still stopped after 30 s without progress)"
)


def ended(run: Run, name: str = "ends cleanly") -> Check:
    if run.ok:
        return Check(name, HELD, run.how_it_ended())
    show_output(run)
    if run.still_moving:
        return Check(name, FAILED, run.how_it_ended(), SLOW_HINT)
    fix = mistakes.hint(run.output) or (HANG_HINT if run.hung else OUTPUT_HINT)
    return Check(name, FAILED, run.how_it_ended(), fix)


RUN_LINES = ("runs on ", "ends cleanly")  # the checklist's lines of a run's own end (ended()'s names)


def not_measured_after_failure(checks: list[Check]) -> list[Check]:
    """Where no run of the learner's file ended cleanly, a later check that failed measured the consequence of that
    failure ("DDP wrapped the model on 0 of 5 ranks" after a crash before DDP), not the learner's choice: it is
    "not measured", naming the first cause, whose own line carries the hint."""
    ends = [c for c in checks if c.name.startswith(RUN_LINES)]
    failed = [c for c in ends if c.verdict == FAILED]
    if not failed or any(c.verdict == HELD for c in ends):
        return checks
    cause = f"not measured: {failed[0].detail}"
    return [
        replace(c, verdict=NOT_RUN, detail=cause, fix="") if c.verdict == FAILED and c not in ends else c
        for c in checks
    ]


def show_output(run: Run, lines: int = 30) -> None:
    """The last lines of a learner's run that failed, on stderr before the checklist: where its error is. The
    traceback torchrun prints of the grader's own stop (a hang's time limit) is left out: it is not the learner's."""
    text = run.output or ""
    if run.timed_out:
        kept = io.StringIO()
        folder = child_output.StackFolder(kept)
        for line in text.splitlines(keepends=True):
            folder.relay(line)
        folder.flush()
        text = kept.getvalue()
    tail = text.splitlines()[-lines:]
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
