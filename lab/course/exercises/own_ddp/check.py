"""The `own-ddp` exercise's checks: the learner's MyDDP driven by the grader's probe
(lab.course.exercises.own_ddp.probe) on 2, 3 and 4 ranks, every rank watched; stage 1 with bucket_mb=0, stage 2
with BUCKET_MB.

What each check reads from the traces (the probe's marks, and the collectives torch was asked for between them):
- runs on N ranks: each run's exit, or who waited in which collective when it hung; a known mistake's error named;
- rank 0's weights reach every rank: every parameter's (sum, norm) on every rank right after the class was built,
  against rank 0's before it (each rank seeded its own weights), exactly;
- one all-reduce a parameter / a bucket: the collectives entered between a step's start and finish() returning, on
  every rank, against the 8 gradients (stage 1) and the buckets BUCKET_MB makes of them (stage 2: 2 or 3, whether a
  bucket closes before the gradient that would overflow it or after it, in MB or MiB, either order);
- the single process's weights: every weight of rank 0 after STEPS steps against one process trained on each step's
  whole batch from rank 0's first weights, within WEIGHT_TOLERANCE, and every rank's against rank 0's;
- all-reduces overlap the backward: the share of a step's all-reduces that were still in flight when the backward
  accumulated another gradient (the probe's hook marks each gradient; an all-reduce leaves when the learner waits
  on its handle), at least OVERLAP_AT_LEAST;
- the frozen layer is not all-reduced: the floats all-reduced a step against the gradients' floats;
- step time beside DDP's: the probe's medians, alternating blocks; and DDP's own overlap (shown, not graded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from lab.course.exercises.grading import Run, each_world, ended, hang, observed
from lab.course.exercises.own_ddp import probe
from lab.course.exercises.own_ddp.traced import COLLECTIVES_IN_A_STEP, Stage, expected_buckets, stages
from lab.course.exercises.trace import Rank
from lab.verdict import FAILED, HELD, NOT_RUN, Check

WORLDS = (2, 3, 4)
PROBE = "lab.course.exercises.own_ddp.probe:probe"
STAGES = {1: 0.0, 2: probe.BUCKET_MB}
# The largest difference a right solution leaves in any weight after 3 steps: float32 sums of the same gradients in
# another order (each rank's mean, all-reduced, divided), measured 1e-7 or less on CPU; a gradient left summed
# (world size x the step) or one rank's own is 1e-3 and more away.
WEIGHT_TOLERANCE = 1e-5
OVERLAP_AT_LEAST = 0.5  # the reference: 7 of 8 in stage 1, 2 of 3 in stage 2 (the last bucket leaves at the end)


@dataclass
class Measured:
    runs: dict[int, Run]  # world size -> the probe's run
    skipped: list[Check] = field(default_factory=list)  # world sizes not started after one hung

    def stage(self, n: int, number: int) -> list[Stage]:
        """Stage `number` of each rank of the run on n ranks (those that reached it)."""
        found = [stages(r).get(number) for r in self.runs[n].ranks]
        return [s for s in found if s is not None]


def measure(file: Path, timeout_seconds: float, worlds: tuple[int, ...] = WORLDS, class_name: str = "") -> Measured:
    """The probe on each world size (tests measure fewer)."""
    args = ["--class", class_name] if class_name else []
    return Measured(
        *each_world(worlds, lambda n: observed(file, n, args, timeout_seconds=timeout_seconds, probe=PROBE))
    )


def judge(m: Measured) -> list[Check]:
    return [
        *(runs_on(n, run) for n, run in m.runs.items()),
        *m.skipped,
        broadcast(m),
        one_allreduce_each(m, 1),
        single_process_weights(m, 1),
        overlap(m, 1),
        one_allreduce_each(m, 2),
        single_process_weights(m, 2),
        overlap(m, 2),
        frozen_left_alone(m),
        beside_ddp(m),
    ]


def check(file: Path, timeout_seconds: float, class_name: str = "") -> list[Check]:
    return judge(measure(file, timeout_seconds, class_name=class_name))


# ---------------------------------------------------------------------------------------------- what went wrong

KNOWN_ERRORS = (
    (
        re.compile(r"NoneType|grad is None|got None"),
        "a parameter without a gradient (the frozen first layer: requires_grad False, .grad None): leave the "
        "parameters whose requires_grad is False out of the buckets and the hooks",
    ),
    (
        re.compile(r"doesn't require gradient|does not require grad"),
        "a hook on a frozen parameter: register hooks only on parameters with requires_grad",
    ),
)


def _hint(text: str) -> str:
    return next((hint for pattern, hint in KNOWN_ERRORS if pattern.search(text)), "")


def runs_on(n: int, run: Run) -> Check:
    check = ended(run, f"runs on {n} ranks")
    missing = _missing(run)
    if missing:
        return Check(check.name, FAILED, f"the file has no class {missing}", "keep the class's name: MyDDP")
    if check.passes or run.still_moving:  # slow, not hung: ended()'s line and hint already say so
        return check
    if any(r.waiting() for r in run.ranks):
        hint = (
            "the ranks made different collectives: every rank must launch the same all-reduces, of the same "
            "buckets, in the same order (here one rank waits in a call the others never made)"
        )
    else:
        hint = _hint(next((e["text"] for r in run.ranks for e in r.of("error")), ""))
    return Check(check.name, check.verdict, check.detail, hint or check.fix)


def _missing(run: Run) -> str:
    return next((e["name"] for r in run.ranks for e in r.of("probe") if e.get("what") == "missing"), "")


def _cause(m: Measured, number: int) -> str | None:
    """Why stage `number` was not measured in every run (the first cause), or None."""
    for n, run in m.runs.items():
        if _missing(run):
            return f"not measured: the file has no class {_missing(run)}"
        if run.still_moving:
            return f"not measured: {run.how_it_ended()}"
        if any(r.waiting() for r in run.ranks):
            return f"not measured: on {n} ranks {hang(run)}"
        reached = m.stage(n, number)
        if number == 2 and any(e.get("what") == "no-buckets" for r in run.ranks for e in r.of("probe")):
            return "not measured: the class takes no bucket size (MyDDP(module, bucket_mb))"
        errors = [s.error for s in reached if s.error]
        if errors:
            return f"not measured: on {n} ranks stage {number} raised {errors[0]}"
        if len(reached) < n or any(len(s.steps) < probe.STEPS or s.final is None for s in reached):
            return f"not measured: {run.how_it_ended()}"
    return None


def broadcast(m: Measured) -> Check:
    name = "rank 0's weights reach every rank"
    compared = 0
    for n in m.runs:
        for number in STAGES:
            stage_ranks = m.stage(n, number)
            if not stage_ranks or stage_ranks[0].initial is None:
                continue
            first = stage_ranks[0].initial
            for s, r in zip(stage_ranks, m.runs[n].ranks):
                if s.constructed is None:
                    continue
                compared += 1
                differ = [p for p, value in first.items() if s.constructed.get(p) != value]
                if differ:
                    return Check(
                        name,
                        FAILED,
                        f"on {n} ranks, rank {r.rank}'s {len(differ)} of {len(first)} parameters after MyDDP(...) "
                        f"are not rank 0's ({differ[0]} first)",
                        "each rank starts from weights of its own: in __init__, dist.broadcast(p.data, src=0) for "
                        "every parameter of the module",
                    )
    if not compared:
        return Check(name, NOT_RUN, _cause(m, 1) or "not measured: the class was never built")
    return Check(name, HELD, f"every parameter on every rank equals rank 0's after construction ({_worlds(m)})")


def _worlds(m: Measured) -> str:
    return ", ".join(map(str, m.runs)) + " ranks"


def _started_apart(m: Measured) -> bool:
    return not broadcast(m).passes and broadcast(m).verdict == FAILED


def _stage_name(number: int) -> str:
    return f"stage {number} ({'bucket_mb=0' if number == 1 else f'bucket_mb={probe.BUCKET_MB}'})"


def one_allreduce_each(m: Measured, number: int) -> Check:
    bucket_mb = STAGES[number]
    what = "a parameter" if number == 1 else f"a {bucket_mb} MiB bucket"
    name = f"{_stage_name(number)}: one all-reduce {what}"
    cause = _cause(m, number)
    if cause:
        return Check(name, NOT_RUN, cause)
    expected = expected_buckets(bucket_mb)
    frozen = probe.frozen_numel(probe.build_model(0))
    trainable = sum(probe.trainable_bytes(probe.build_model(0))) // 4
    for n in m.runs:
        for s, r in zip(m.stage(n, number), m.runs[n].ranks):
            for k, step in enumerate(s.steps):
                ops = [c["op"] for c in step.collectives]
                count = sum(op in COLLECTIVES_IN_A_STEP for op in ops)
                others = sorted(set(ops) - COLLECTIVES_IN_A_STEP)
                # the frozen layer all-reduced too is the frozen check's finding: counted with it here
                allowed = expected if step.floats != trainable + frozen else expected | {c + 2 for c in expected}
                if count not in allowed or others:
                    return Check(
                        name,
                        FAILED,
                        f"on {n} ranks, rank {r.rank}'s step {k}: {count} all-reduces"
                        + (f" and {', '.join(others)}" if others else "")
                        + f", for {' or '.join(map(str, sorted(expected)))}",
                        _count_hint(number, count, others, expected),
                    )
    shown = " or ".join(map(str, sorted(expected)))
    return Check(name, HELD, f"{shown} all-reduces every step on every rank ({_worlds(m)})")


def _count_hint(number: int, count: int, others: list[str], expected: set[int]) -> str:
    gradients = len(probe.trainable_bytes(probe.build_model(0)))
    if others:
        return "the gradients go in all-reduces only (the sum of every rank's): dist.all_reduce(flat, async_op=True)"
    if count == 0:
        return "launch dist.all_reduce(flat, async_op=True) from the gradient hook when a bucket is full"
    if number == 2 and count == gradients:
        return (
            "one all-reduce per gradient: bucket_mb is not used. Fill each bucket up to bucket_mb MiB "
            "(a new bucket when the next gradient would not fit), one all-reduce a bucket"
        )
    if count < min(expected):
        return "buckets larger than bucket_mb: start a new bucket when the next gradient would not fit"
    return (
        "each bucket's gradients in one flat tensor (torch.cat of their .reshape(-1)) and one all-reduce of it, "
        "launched once, when its last gradient is in"
    )


def single_process_weights(m: Measured, number: int) -> Check:
    name = f"{_stage_name(number)}: the single process's weights"
    cause = _cause(m, number)
    if cause:
        return Check(name, NOT_RUN, cause)
    if _started_apart(m):
        return Check(name, NOT_RUN, "not measured: the ranks started from weights of their own (see the broadcast)")
    largest, compared = 0.0, 0
    for n in m.runs:
        ranks = m.stage(n, number)
        weights = ranks[0].weights or {}
        if weights.get("largest", float("inf")) > WEIGHT_TOLERANCE:
            summed = weights.get("summed", float("inf")) <= WEIGHT_TOLERANCE
            return Check(
                name,
                FAILED,
                f"on {n} ranks, after {probe.STEPS} steps rank 0's {weights.get('where')} is "
                f"{weights.get('largest', float('nan')):.1e} from one process's on the whole batch "
                f"(more than {WEIGHT_TOLERANCE:g})",
                "all-reduce sums the ranks' gradients: divide by dist.get_world_size() in finish(), for their mean"
                if summed
                else "every gradient all-reduced, waited for, divided by the world size and copied back into its "
                ".grad before the optimizer step",
            )
        for s, r in zip(ranks[1:], m.runs[n].ranks[1:]):
            apart = [p for p, v in (ranks[0].final or {}).items() if not _close((s.final or {}).get(p), v)]
            if apart:
                return Check(
                    name,
                    FAILED,
                    f"on {n} ranks, rank {r.rank}'s {apart[0]} is not rank 0's after {probe.STEPS} steps",
                    "every rank must step with the same averaged gradients: copy each all-reduced bucket back into "
                    "the .grad of its parameters on every rank",
                )
        largest, compared = max(largest, weights["largest"]), weights["compared"]
    return Check(
        name,
        HELD,
        f"{compared} weights after {probe.STEPS} steps, the largest difference {largest:.1e} "
        f"(within {WEIGHT_TOLERANCE:g}), every rank equal ({_worlds(m)})",
    )


def _close(a: list[float] | None, b: list[float]) -> bool:
    return a is not None and all(abs(x - y) <= WEIGHT_TOLERANCE * max(1.0, abs(y)) for x, y in zip(a, b))


def overlap(m: Measured, number: int) -> Check:
    name = f"{_stage_name(number)}: all-reduces overlap the backward"
    cause = _cause(m, number)
    if cause:
        return Check(name, NOT_RUN, cause)
    totals = {"all": 0, "in_flight": 0, "after_backward": 0, "after_last": 0, "never_waited": 0}
    for n in m.runs:
        for s in m.stage(n, number):
            for step in s.steps:
                totals["all"] += sum(c["op"] in COLLECTIVES_IN_A_STEP for c in step.collectives)
                totals["in_flight"] += step.in_flight
                totals["after_backward"] += step.after_backward
                totals["after_last"] += step.after_last_gradient
                totals["never_waited"] += step.never_waited
    if not totals["all"]:
        return Check(name, NOT_RUN, "not measured: no all-reduce in a step (see the all-reduce count)")
    share = totals["in_flight"] / totals["all"]
    measured = (
        f"{totals['in_flight']} of {totals['all']} all-reduces ({share:.0%}) in flight while the backward computed "
        f"more gradients ({_worlds(m)}; at least {OVERLAP_AT_LEAST:.0%})"
    )
    if totals["never_waited"]:
        return Check(
            name,
            FAILED,
            f"{totals['never_waited']} of {totals['all']} all-reduces were never waited for before the optimizer step",
            "keep each handle dist.all_reduce(..., async_op=True) returns and .wait() on it in finish(): until then "
            "the sum may not be in the tensor",
        )
    if share >= OVERLAP_AT_LEAST:
        return Check(name, HELD, measured)
    return Check(name, FAILED, measured, _overlap_hint(totals))


def _overlap_hint(totals: dict[str, int]) -> str:
    if totals["after_backward"] >= totals["all"] / 2:
        return (
            "the all-reduces start after loss.backward() returned: nothing left to overlap. Launch each from the "
            "gradient hook (register_post_accumulate_grad_hook) as soon as its bucket is full"
        )
    if totals["after_last"] >= totals["all"] / 2:
        return (
            "every all-reduce starts after the backward's last gradient: the first bucket in your order is ready "
            "last. The backward makes the last layer's gradients first: fill the buckets in reversed(parameters) "
            "order"
        )
    return (
        "each all-reduce is waited for before the backward goes on (a synchronous all_reduce, or .wait() in the "
        "hook): launch it with async_op=True, keep the handle, and wait in finish()"
    )


def frozen_left_alone(m: Measured) -> Check:
    name = "the frozen layer is not all-reduced"
    model = probe.build_model(0)
    trainable, frozen = sum(probe.trainable_bytes(model)) // 4, probe.frozen_numel(model)
    measured_any = False
    for number in STAGES:
        if _cause(m, number):
            continue
        for n in m.runs:
            for s, r in zip(m.stage(n, number), m.runs[n].ranks):
                for step in s.steps:
                    measured_any = True
                    if step.floats > trainable:
                        frozen_too = step.floats == trainable + frozen
                        return Check(
                            name,
                            FAILED,
                            f"on {n} ranks, rank {r.rank} all-reduced {step.floats} floats a step; the gradients "
                            f"hold {trainable}" + (" (the frozen layer's too)" if frozen_too else ""),
                            "a frozen parameter (requires_grad False) has no gradient to average: leave it out"
                            if frozen_too
                            else "each gradient once a step: one hook a parameter, one all-reduce a bucket",
                        )
    if not measured_any:
        return Check(name, NOT_RUN, _cause(m, 1) or "not measured")
    if not any(step.floats for number in STAGES for n in m.runs for s in m.stage(n, number) for step in s.steps):
        return Check(name, NOT_RUN, "not measured: no all-reduce in a step (see the all-reduce count)")
    return Check(name, HELD, f"{trainable} floats all-reduced a step, the gradients' own; the frozen {frozen} left")


def beside_ddp(m: Measured) -> Check:
    name = "step time beside DistributedDataParallel's (shown, not graded)"
    shown = []
    for n, run in m.runs.items():
        rank = run.ranks[0] if run.ranks else None
        timing = next((e for e in rank.of("probe") if e.get("what") == "timing"), None) if rank else None
        if timing is None or rank is None:
            continue
        yours = _overlap_share(m, n)
        ddp = ddp_overlap(rank)
        shown.append(
            f"{n} ranks: {timing['yours'] * 1e3:.1f} vs {timing['ddp'] * 1e3:.1f} ms "
            f"({timing['yours'] / timing['ddp']:.2f}x); overlap {yours:.0%} vs {ddp:.0%}"
        )
    if not shown:
        return Check(name, NOT_RUN, _cause(m, 2) or "not measured: the timing did not run")
    return Check(name, HELD, f"yours vs DDP's, {probe.BUCKET_MB} MiB buckets: " + "; ".join(shown))


def _overlap_share(m: Measured, n: int) -> float:
    steps = [step for s in m.stage(n, 2) for step in s.steps]
    launched = sum(sum(c["op"] in COLLECTIVES_IN_A_STEP for c in step.collectives) for step in steps)
    return sum(step.in_flight for step in steps) / launched if launched else 0.0


def ddp_overlap(rank: Rank) -> float:
    """The share of DDP's bucket all-reduces launched before the backward's last gradient (its one marked step)."""
    inside, launched, last = False, [], -1
    for i, e in enumerate(rank.events):
        if e["e"] != "probe":
            continue
        what = e.get("what")
        if what == "ddp_step":
            inside = e["phase"] == "begin"
        elif inside and what == "ddp_bucket":
            launched.append(i)
        elif inside and what == "grad":
            last = i
    return sum(i < last for i in launched) / len(launched) if launched else 0.0
