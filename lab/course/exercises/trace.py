"""What one observed rank did, read back from its trace (lab.course.exercises.observe wrote it, a line an event).

>>> t = Rank(0, [{"e": "epoch"}, {"e": "batch", "idx": [3, 1]}, {"e": "batch", "idx": [2]}, {"e": "epoch"},
...              {"e": "batch", "idx": [1, 3, 2]}, {"e": "loss", "v": 2.5}, {"e": "step", "state_bytes": 8}])
>>> t.epochs, t.losses, t.steps
([[3, 1, 2], [1, 3, 2]], [2.5], 1)
>>> Rank(1, [{"e": "coll", "phase": "enter", "seq": 1, "op": "all_reduce", "where": "f.py:9 in main"}]).waiting()
{'seq': 1, 'op': 'all_reduce', 'where': 'f.py:9 in main'}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.course.exercises import stacks

STEP_LOSS = re.compile(r"step\s+(\d+)\D.*?loss\s+([-+0-9.eE]+|nan|inf)")


@dataclass
class Rank:
    rank: int
    events: list[dict[str, Any]]
    stack: str | None = None  # where its main thread was when the grader stopped it (lab.course.exercises.stacks)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["e"] == kind]

    def has(self, kind: str) -> bool:
        return any(e["e"] == kind for e in self.events)

    @property
    def pid(self) -> int | None:
        """The rank's process id, from its "start" event (None before the observer started)."""
        return next((e["pid"] for e in self.of("start") if "pid" in e), None)

    @property
    def epochs(self) -> list[list[int]]:
        """The dataset indices this rank read, per DataLoader iteration (an epoch each)."""
        found: list[list[int]] = []
        for e in self.events:
            if e["e"] == "epoch":
                found.append([])
            elif e["e"] == "batch":
                if not found:
                    found.append([])
                found[-1].extend(e["idx"])
        return [epoch for epoch in found if epoch]

    @property
    def losses(self) -> list[float]:
        """Each training loss in order: its value where the observer read it at once (CPU), else by its index from
        the values read together later (CUDA: lab.course.exercises.recorder.Recorder.loss). A device loss whose
        value was never read (the rank was killed first) is left out.

        >>> Rank(0, [{"e": "loss", "i": 0}, {"e": "loss", "i": 1}, {"e": "loss_values", "first": 0, "v": [2.5, 2.25]},
        ...          {"e": "loss", "i": 2}]).losses
        [2.5, 2.25]
        """
        read = {e["first"] + k: v for e in self.events if e["e"] == "loss_values" for k, v in enumerate(e["v"])}
        found = []
        for e in self.events:
            if e["e"] == "loss" and "v" in e:
                found.append(e["v"])
            elif e["e"] == "loss" and e.get("i") in read:
                found.append(read[e["i"]])
        return found

    @property
    def steps(self) -> int:
        return sum(e["e"] == "step" for e in self.events)

    def printed_losses(self) -> dict[int, float]:
        """{step: loss} from the lines this rank printed ("... step 3 ... loss 2.17")."""
        found = {}
        for e in self.of("print"):
            m = STEP_LOSS.search(e["text"])
            if m:
                found[int(m.group(1))] = float(m.group(2))
        return found

    def collectives(self, op: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["e"] == "coll" and e["phase"] == "enter" and (op is None or e["op"] == op)]

    def waiting(self) -> dict[str, Any] | None:
        """The collective this rank entered and never left (where it was when stopped), or None. An async one
        (async_op=True) holds the rank only once it waits on its handle: there, at the line of the wait.

        >>> Rank(0, [{"e": "coll", "phase": "enter", "seq": 1, "op": "all_reduce", "async": True, "where": "f.py:3"},
        ...          {"e": "coll", "phase": "enter", "seq": 2, "op": "barrier", "where": "f.py:5"}]).waiting()["seq"]
        2
        """
        events = [e for e in self.events if e["e"] == "coll"]
        left = {e["seq"] for e in events if e["phase"] == "exit"}
        waits = {e["seq"]: e for e in events if e["phase"] == "wait"}
        open_ = [e for e in self.collectives() if e["seq"] not in left and (not e.get("async") or e["seq"] in waits)]
        if not open_:
            return None
        first = open_[0]
        where = waits[first["seq"]] if first["seq"] in waits else first
        return {"seq": first["seq"], "op": first["op"], "where": where.get("where", "?")}

    @property
    def ended(self) -> bool:
        return self.has("end")

    def models(self) -> list[dict[str, Any]]:
        ends = self.of("end")
        return ends[-1]["models"] if ends else []

    def allreduces_per_step(self) -> list[int]:
        """DDP's bucket all-reduces between one optimizer step and the next."""
        counts, current = [], 0
        for e in self.events:
            if e["e"] == "coll" and e["phase"] == "enter" and e["op"] == "ddp_allreduce":
                current += 1
            elif e["e"] == "step":
                counts.append(current)
                current = 0
        return counts

    def buckets(self) -> int:
        """How many buckets one backward all-reduces (the distinct bucket indices seen)."""
        return len({e.get("bucket") for e in self.collectives("ddp_allreduce")})


def read(folder: Path, world_size: int) -> list[Rank]:
    """Every rank's trace in rank order (a rank that never started has an empty one)."""
    ranks = []
    for rank in range(world_size):
        path = Path(folder) / f"rank-{rank}.jsonl"
        events = []
        if path.exists():
            for line in path.read_text(errors="replace").splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:  # the last line of a rank killed mid-write
                    continue
        ranks.append(Rank(rank, events, stacks.read(folder, rank)))
    return ranks
