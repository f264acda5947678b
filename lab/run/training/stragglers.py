"""Which rank the others wait for, and by how much: from each rank's wait in its gradient all-reduce.

Under DDP every rank's step takes the same time (the all-reduce makes them meet), so a slow rank does not show in
its own step time: it shows in the others' waiting. DDP's reducer times each rank's backward communication (the
first bucket's all-reduce launched to the last one done: transfer plus waiting for the peers) every
`_set_ddp_runtime_logging_sample_rate` steps, with CUDA events on a GPU, read at log intervals only (no host sync
in the step loop). The transfer is the same on every rank, so the rank that waits least is the one the others
waited for; its lag is how much longer the other ranks wait (their median), a step.

>>> s = straggler([0.080, 0.010, 0.081, 0.079], step_seconds=0.12)
>>> s["rank"], round(s["lag_seconds"], 3), round(s["share"], 2)
(1, 0.07, 1.75)
>>> tally = Tally(); [tally.add(straggler(w, 0.12)) for w in ([0.10, 0.01], [0.10, 0.012], [0.01, 0.09])]
[None, None, None]
>>> tally.summary()["rank"], tally.summary()["intervals"], tally.summary()["flagged"]
(1, '2 of 3', True)
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

SHARE = 0.5  # a rank flagged when it takes 50% longer a step than the others
MOST = 2 / 3  # ... in at least this share of the log intervals (by chance: 1 in world size)


def straggler(waits: list[float], step_seconds: float) -> dict[str, Any] | None:
    """The rank that waited least (the one the others waited for): its lag a step and its share, the lag over the
    other ranks' own time a step (step time less their wait). None with fewer than 2 ranks or no measurement."""
    if len(waits) < 2 or not all(w > 0 for w in waits):
        return None
    rank = min(range(len(waits)), key=waits.__getitem__)
    others = statistics.median(w for r, w in enumerate(waits) if r != rank)
    lag = others - waits[rank]
    own = step_seconds - others  # the other ranks' own time a step (their step less their wait)
    return {"rank": rank, "lag_seconds": lag, "share": lag / own if own > 0 else None}


class Tally:
    """The run's stragglers over its log intervals: the rank slowest most often, and its median share."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def add(self, found: dict[str, Any] | None) -> None:
        if found is not None:
            self.seen.append(found)

    def summary(self) -> dict[str, Any] | None:
        if not self.seen:
            return None
        rank, times = Counter(s["rank"] for s in self.seen).most_common(1)[0]
        its = [s for s in self.seen if s["rank"] == rank]
        shares = [s["share"] for s in its if s["share"] is not None]
        share = statistics.median(shares) if shares else None
        return {
            "rank": rank,
            "intervals": f"{times} of {len(self.seen)}",
            "lag_seconds": statistics.median(s["lag_seconds"] for s in its),
            "share": share,
            # flagged: the same rank was the slowest in at least MOST of the intervals, by more than SHARE
            "flagged": bool(share is not None and share > SHARE and times >= MOST * len(self.seen)),
        }


def describe(summary: dict[str, Any]) -> str:
    """One line for the console and the report."""
    share = f", {summary['share']:.0%} longer a step than the others" if summary.get("share") is not None else ""
    verdict = "a straggler" if summary["flagged"] else "no straggler"
    return (
        f"rank {summary['rank']} was the slowest in {summary['intervals']} log intervals (the others waited "
        f"{summary['lag_seconds'] * 1e3:.1f} ms a step for it{share}): {verdict}"
    )
