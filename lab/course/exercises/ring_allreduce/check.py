"""The `ring-allreduce` exercise's checks: the learner's ring_all_reduce called by the grader's probe
(lab.course.exercises.ring_allreduce.probe) on 2, 3 and 4 ranks, each rank watched.

What each check reads from the traces (the probe's findings and the collectives torch was asked for):
- runs on N ranks: each run's exit, or who waited in which collective when it hung;
- equals dist.all_reduce: every element of the tensor the learner's function was given, after the call, against
  the library's sum, for 1, 7, 1200 and 4099 float32 elements (1200 divides by 2, 3 and 4, the others by none);
- only send and recv: the torch.distributed calls recorded between the probe's marks around each graded call:
  send/recv/isend/irecv (and batch_isend_irecv) only, and at least one;
- bus bandwidth: the learner's and the library's seconds per call at 4 MiB in the same run, as nccl-tests counts
  it (2 (n - 1) / n * bytes / time, the slowest rank's median): shown, not graded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.course.exercises import grading
from lab.course.exercises.grading import Run, each_world, ended, observed
from lab.course.exercises.ring_allreduce.probe import ATOL, FUNCTION, SIZES
from lab.course.exercises.trace import Rank
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLDS = (2, 3, 4)
PROBE = "lab.course.exercises.ring_allreduce.probe:probe"
POINT_TO_POINT = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}
SHOWN = 3  # wrong results listed in `measured`, the rest counted


@dataclass
class Measured:
    runs: dict[int, Run]  # world size -> the probe's run
    skipped: list[Check] = field(default_factory=list)  # world sizes not started after one hung


def measure(file: Path, timeout_seconds: float, worlds: tuple[int, ...] = WORLDS) -> Measured:
    """The probe on each world size (tests measure fewer)."""
    return Measured(*each_world(worlds, lambda n: observed(file, n, [], timeout_seconds=timeout_seconds, probe=PROBE)))


def judge(m: Measured) -> list[Check]:
    return [
        *(ended(run, f"runs on {n} ranks") for n, run in m.runs.items()),
        *m.skipped,
        equals_library(m.runs),
        only_point_to_point(m.runs),
        bus_bandwidth(m.runs),
    ]


def check(file: Path, timeout_seconds: float) -> list[Check]:
    return judge(measure(file, timeout_seconds))


def _probes(rank: Rank, what: str) -> list[dict[str, Any]]:
    return [e for e in rank.of("probe") if e.get("what") == what]


def _missing(runs: dict[int, Run]) -> bool:
    return any(_probes(r, "missing") for run in runs.values() for r in run.ranks)


def _first_error(runs: dict[int, Run]) -> str | None:
    for n, run in runs.items():
        for r in run.ranks:
            for e in _probes(r, "error"):
                return f"{e['numel']} floats on {n} ranks: rank {r.rank} raised {e['error']}"
    return None


def _floats(numel: int) -> str:
    return f"{numel} float" + ("" if numel == 1 else "s")


CHUNK_HINT = (
    "right where the size divides by the world size, wrong where it does not: split into world_size chunks that "
    "cover every element, the first numel % world_size one element longer (a chunk may be empty when there are "
    "fewer elements than ranks)"
)
RING_HINT = (
    "on 2 ranks the left and the right neighbour are the same rank and one step "
    "is the whole ring. Send to (rank + 1) % world_size, receive from (rank - 1) % world_size, and take "
    "world_size - 1 steps in each phase (reduce-scatter, then all-gather)"
)
IN_PLACE_HINT = (
    "ring_all_reduce returned the sum but left the tensor it was given as it was: like dist.all_reduce it works in "
    "place (add into views of tensor.view(-1), receive the gathered chunks straight into them)"
)
GENERIC_HINT = (
    "reduce-scatter first (world_size - 1 steps: send one chunk right, add the chunk that arrives from the left "
    "into yours), then all-gather (world_size - 1 steps: pass on the chunk whose full sum you hold last)"
)


def equals_library(runs: dict[int, Run]) -> Check:
    name = "equals dist.all_reduce for every size"
    if _missing(runs):
        return Check(name, FAILED, f"the file has no function {FUNCTION}", f"define {FUNCTION}(tensor) at top level")
    # (world, numel) -> the result on each rank that reported one
    results: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for n, run in runs.items():
        for r in run.ranks:
            for e in _probes(r, "result"):
                results.setdefault((n, e["numel"]), []).append(e)
    error = _first_error(runs)
    if error:
        for run in runs.values():
            if not run.ok:
                grading.show_output(run)
                break
        return Check(name, FAILED, error, grading.OUTPUT_HINT)
    expected = {(n, numel) for n in runs for numel in SIZES}
    unmeasured = sorted(expected - set(results))
    if unmeasured:
        n, numel = unmeasured[0]
        return Check(name, NOT_RUN, f"not measured: {_floats(numel)} on {n} ranks ({runs[n].how_it_ended()})")
    wrong = {key: found for key, found in results.items() if any(e["wrong"] for e in found)}
    sizes = ", ".join(map(str, SIZES))
    worlds = ", ".join(map(str, runs))
    if not wrong:
        largest = max(e["max_diff"] for found in results.values() for e in found)
        return Check(
            name,
            HELD,
            f"{sizes} floats on {worlds} ranks: every element within {ATOL:g} of the library's "
            f"(largest difference {largest:.1e})",
        )
    described = []
    for (n, numel), found in sorted(wrong.items())[:SHOWN]:
        worst = max(found, key=lambda e: e["wrong"])
        described.append(
            f"{_floats(numel)} on {n} ranks: {worst['wrong']} of {numel} elements differ "
            f"(the first at {worst['first_wrong']})"
        )
    more = len(wrong) - SHOWN
    measured = "; ".join(described) + (f"; and {more} more" if more > 0 else "")
    return Check(name, FAILED, measured, _likely_cause(wrong, results, _sends_per_call(runs)))


def _likely_cause(
    wrong: dict[tuple[int, int], list[dict]], results: dict[tuple[int, int], list[dict]], sends: dict[int, int]
) -> str:
    """The hint the pattern of wrong results points to (sends: each world's point-to-point sends per call)."""
    if any(e["returned_right"] for found in wrong.values() for e in found):
        return IN_PLACE_HINT
    if all(numel % n for n, numel in wrong) and any(numel % n == 0 for n, numel in results):
        return CHUNK_HINT
    steps = {n: made for n, made in sends.items() if made != 2 * (n - 1)}
    if any(n in steps for n, _ in wrong):
        n = next(n for n, _ in wrong if n in steps)
        return f"on {n} ranks each call sent {steps[n]} messages, a ring {2 * (n - 1)}: " + RING_HINT
    if any(n == 2 for n, _ in results) and not any(n == 2 for n, _ in wrong):
        return "right on 2 ranks, wrong on more: " + RING_HINT
    return GENERIC_HINT


def _sends_per_call(runs: dict[int, Run]) -> dict[int, int]:
    """Rank 0's sends in its last graded call, per world size (where it made one): each send or isend, and each
    batch_isend_irecv (a ring's step: one send to the right grouped with one receive from the left)."""
    found = {}
    for n, run in runs.items():
        calls = _inside_calls(run.ranks[0]) if run.ranks else []
        if calls:
            found[n] = sum(e["op"] in ("send", "isend", "batch_isend_irecv") for e in calls[-1])
    return found


def _inside_calls(rank: Rank) -> list[list[dict[str, Any]]]:
    """The collectives recorded inside each graded call, in order."""
    calls: list[list[dict[str, Any]]] = []
    inside = False
    for e in rank.events:
        if e["e"] == "probe" and e.get("what") == "call":
            inside = e["phase"] == "begin"
            if inside:
                calls.append([])
        elif inside and e["e"] == "coll" and e["phase"] == "enter":
            calls[-1].append(e)
    return calls


def only_point_to_point(runs: dict[int, Run]) -> Check:
    name = "only send and recv inside it"
    counts = []
    for n, run in runs.items():
        for r in run.ranks:
            calls = _inside_calls(r)
            for call in calls:
                other = [e for e in call if e["op"] not in POINT_TO_POINT]
                if other:
                    return Check(
                        name,
                        FAILED,
                        f"on {n} ranks, rank {r.rank}'s ring_all_reduce called dist.{other[0]['op']} "
                        f"({other[0].get('where', '?')})",
                        "the exercise is all-reduce built from point-to-point messages: dist.batch_isend_irecv (or "
                        "send/recv, isend/irecv) only; a library collective inside does the work for you",
                    )
                if not call:
                    return Check(
                        name,
                        FAILED,
                        f"on {n} ranks, rank {r.rank}'s ring_all_reduce made no torch.distributed call",
                        "the sum must travel round the ring through dist.batch_isend_irecv (or send/recv); a call the "
                        "check cannot see (a ProcessGroup's own methods, distributed_c10d's) does not count",
                    )
            if r.rank == 0 and calls:
                sends = sum(e["op"] in ("send", "isend") for e in calls[-1])
                receives = sum(e["op"] in ("recv", "irecv") for e in calls[-1])
                batches = sum(e["op"] == "batch_isend_irecv" for e in calls[-1])
                made = ", ".join(
                    [f"{sends} sends, {receives} receives"] * bool(sends or receives or not batches)
                    + [f"{batches} grouped send/receive steps"] * bool(batches)
                )
                counts.append(f"{n} ranks: {made} a call (a ring's 2(n-1) = {2 * (n - 1)} steps)")
    if not counts:
        run = next(iter(runs.values()))
        return Check(name, NOT_RUN, f"not measured: {run.how_it_ended()}")
    return Check(name, HELD, "rank 0 on " + "; ".join(counts))


def _bus_bandwidth(run: Run) -> tuple[float, float, int] | None:
    """(yours, the library's) bus bandwidth in bytes/s, and the bytes: each rank's median, the slowest rank's."""
    timings = [t for r in run.ranks for t in _probes(r, "timing")]
    if len(timings) != run.world_size:
        return None
    n, size = run.world_size, timings[0]["bytes"]
    factor = 2 * (n - 1) / n * size  # the bytes each rank sends (and receives) in a ring all-reduce
    yours = max(t["yours_median"] for t in timings)
    library = max(t["library_median"] for t in timings)
    return factor / yours, factor / library, size


def bus_bandwidth(runs: dict[int, Run]) -> Check:
    name = "bus bandwidth beside dist.all_reduce's (shown, not graded)"
    shown, size = [], 0
    for n, run in runs.items():
        found = _bus_bandwidth(run)
        if found:
            yours, library, size = found
            shown.append(f"{n} ranks: {yours / 1e9:.2f} vs {library / 1e9:.2f} GB/s ({yours / library:.2f}x)")
    if not shown:
        run = next(iter(runs.values()))
        return Check(name, NOT_RUN, f"not measured: {run.how_it_ended()}")
    return Check(name, HELD, f"yours vs the library's at {size / 2**20:g} MiB: " + "; ".join(shown))
