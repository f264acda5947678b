"""What the own-ddp probe's marks and the observer's records say, read back from one rank's trace: each stage's
weights (before, after construction, after its steps) and each step's collectives, with where each one started and
left against the backward's gradients (lab.course.exercises.own_ddp.check grades them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lab.course.exercises.own_ddp import probe
from lab.course.exercises.trace import Rank

COLLECTIVES_IN_A_STEP = {"all_reduce"}


def expected_buckets(bucket_mb: float) -> set[int]:
    """The bucket counts a right MyDDP makes of the grader's model's gradients at `bucket_mb`: a bucket closed before
    the gradient that would overflow it or after the one that fills it, MB or MiB, reversed or the model's order.

    >>> sorted(expected_buckets(0.0)), sorted(expected_buckets(0.3))
    ([8], [2, 3])
    """
    sizes = probe.trainable_bytes(probe.build_model(0))
    found = set()
    for cap in (bucket_mb * 1e6, bucket_mb * 2**20):
        for order in (sizes, sizes[::-1]):
            found |= {_close_before(order, cap), _close_after(order, cap)}
    return found


def _close_before(sizes: list[int], cap: float) -> int:
    count, filled = 0, 0
    for size in sizes:
        if filled and filled + size > cap:
            count, filled = count + 1, 0
        filled += size
    return count + (1 if filled else 0)


def _close_after(sizes: list[int], cap: float) -> int:
    count, filled = 0, 0
    for size in sizes:
        filled += size
        if filled >= cap:
            count, filled = count + 1, 0
    return count + (1 if filled else 0)


@dataclass
class Step:
    """One graded step on one rank, read from its trace."""

    collectives: list[dict[str, Any]] = field(default_factory=list)  # entered between begin and finished
    floats: int = 0  # all-reduced
    in_flight: int = 0  # all-reduces not yet waited for at a later gradient (overlapping the backward)
    after_backward: int = 0  # entered after loss.backward() returned
    after_last_gradient: int = 0  # entered during the backward, but after its last gradient
    never_waited: int = 0  # not waited for by the time finish() returned


@dataclass
class Stage:
    number: int
    initial: dict[str, list[float]] | None = None
    constructed: dict[str, list[float]] | None = None
    final: dict[str, list[float]] | None = None
    weights: dict[str, Any] | None = None
    steps: list[Step] = field(default_factory=list)
    error: str | None = None


def stages(rank: Rank) -> dict[int, Stage]:
    """What the probe marked on this rank, a Stage each."""
    found: dict[int, Stage] = {}
    current: Stage | None = None
    events = rank.events
    for i, e in enumerate(events):
        if e["e"] != "probe":
            continue
        what = e.get("what")
        if what == "stage":
            current = found[e["stage"]] = Stage(e["stage"])
        elif current is None:
            continue
        elif what in ("initial", "constructed", "final"):
            setattr(current, what, e["sums"])
        elif what == "weights":
            current.weights = e
        elif what == "error":
            current.error = e["text"]
        elif what == "step" and e["phase"] == "begin":
            current.steps.append(_step(events, i))
    return found


def _step(events: list[dict[str, Any]], begin: int) -> Step:
    step = Step()
    marks: dict[str, int] = {}
    grads: list[int] = []
    for i in range(begin + 1, len(events)):
        e = events[i]
        if e["e"] == "probe" and e.get("what") == "step":
            marks[e["phase"]] = i
            if e["phase"] == "finished":
                break
        elif e["e"] == "probe" and e.get("what") == "grad":
            grads.append(i)
        elif e["e"] == "coll" and e["phase"] == "enter" and "finished" not in marks:
            step.collectives.append({**e, "index": i})
    end = marks.get("finished", len(events))
    # Where the learner's code let each all-reduce go: an async one at the wait on its handle (the host's order is
    # the compute stream's: on NCCL a wait in the hook holds the later gradients' kernels behind it, though the
    # host call returns at once), a synchronous one where it was called (the caller waits there).
    waits = {e["seq"]: i for i, e in enumerate(events) if e["e"] == "coll" and e["phase"] == "wait"}
    last_gradient = grads[-1] if grads else begin
    for c in step.collectives:
        if c["op"] not in COLLECTIVES_IN_A_STEP:
            continue
        step.floats += sum(_numel(shape) for shape in c.get("shapes") or [])
        waited = waits.get(c["seq"]) if c.get("async") else c["index"]
        if waited is None or waited > end:
            step.never_waited += 1
        if any(c["index"] < g < (waited if waited is not None else end) for g in grads):
            step.in_flight += 1
        if c["index"] > marks.get("backward", end):
            step.after_backward += 1
        elif c["index"] > last_gradient:
            step.after_last_gradient += 1
    return step


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
