"""A hang read from the ranks' snapshots (lab.run.cluster.flight): who waits in which collective, who never came, who
went to another collective, who died; one block for the terminal and the same as hang.json.

A run's diagnosis folder holds `hang/rank-N.json` (each rank's snapshot, written by its watchdog when it stalled
or was asked to, or when a collective raised) and `hang.json` (the diagnosis). For `lab train` the folder is the
run directory; `lab hang DIR` reads it again after the run is gone.

>>> snaps = {
...     0: {"groups": {"0": {"enqueued": 4, "completed": 3}}, "where": None,
...         "entries": [{"group": "0", "seq": 4, "op": "all_reduce", "sizes": [[8]],
...                      "where": {"file": "t.py", "line": 13, "function": "step"}}]},
...     1: {"groups": {"0": {"enqueued": 3, "completed": 3}}, "entries": [],
...         "where": {"file": "t.py", "line": 11, "function": "step"}},
... }
>>> d = diagnose(snaps, world_size=3, exits={2: "Signal 9 (SIGKILL) received by PID 42"})
>>> print(d["summary"])
rank 0 waits in all_reduce #4 at t.py:13 in step; rank 1 never came (at t.py:11 in step); rank 2 died (Signal 9
(SIGKILL) received by PID 42)
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from lab import atomic

FOLDER_ENV = "LAB_HANG_DIR"  # the diagnosis folder the launching parent chose (the run directory for lab train)
SNAPSHOTS = "hang"  # the folder of the ranks' snapshots, beside hang.json
DIAGNOSIS = "hang.json"
DEFAULT_GROUP = "0"


def snapshot_path(folder: Path, rank: int) -> Path:
    return Path(folder) / SNAPSHOTS / f"rank-{rank}.json"


def read_snapshots(folder: Path) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for path in sorted((Path(folder) / SNAPSHOTS).glob("rank-*.json")):
        try:
            snap = json.loads(path.read_text())
            found[int(path.stem.split("-")[1])] = snap
        except (OSError, ValueError, IndexError):
            continue  # a rank killed while writing: as if it had written nothing
    return found


def _where(frame: dict[str, Any] | None) -> str:
    if not frame:
        return "an unknown line"
    if "text" in frame:  # a place that is not a line (the exercises' "DDP backward")
        return str(frame["text"])
    return f"{frame['file']}:{frame['line']} in {frame['function']}"


def _in_flight(snap: dict[str, Any], group: str) -> dict[str, Any] | None:
    """The collective this rank waits in on `group`, with its entry where one was kept: the first it enqueued and
    has not completed, `completed + 1`. Not the last enqueued: NCCL enqueues asynchronously, so a rank that waits in
    bucket all-reduce #5 may have queued #6 and #7 behind it (gloo and the Python record enqueue one at a time,
    where the two are the same)."""
    status = (snap.get("groups") or {}).get(group)
    if not status or status["enqueued"] <= status["completed"]:
        return None
    seq = status["completed"] + 1
    entry = next((e for e in snap.get("entries") or [] if e["group"] == group and e["seq"] == seq), None)
    return entry or {"group": group, "seq": seq, "op": "a collective", "sizes": None, "where": None}


def _stuck_group(snapshots: dict[int, dict[str, Any]]) -> str | None:
    """The group someone waits in: the default group first, then the one most ranks wait in."""
    counts = Counter(g for s in snapshots.values() for g in (s.get("groups") or {}) if _in_flight(s, g))
    if not counts:
        return None
    return DEFAULT_GROUP if DEFAULT_GROUP in counts else counts.most_common(1)[0][0]


def diagnose(
    snapshots: dict[int, dict[str, Any]], world_size: int, exits: dict[int, str] | None = None
) -> dict[str, Any]:
    """The hang: for each rank, waiting (in what), elsewhere (never came: where it is), mismatched (in another
    collective at the same number), ahead, dead (its exit), or silent (no record and no exit)."""
    exits = exits or {}
    group = _stuck_group(snapshots)
    ranks: list[dict[str, Any]] = []
    if group is None:
        for r in range(world_size):
            snap = snapshots.get(r)
            if snap is None:
                ranks.append(_absent(r, exits))
            else:
                ranks.append({"rank": r, "state": "elsewhere", "where": snap.get("where")})
        return _finish(None, None, ranks, world_size, _records(snapshots))
    flights = {r: _in_flight(s, group) for r, s in snapshots.items()}
    waiting = {r: f for r, f in flights.items() if f is not None}
    seq = Counter(f["seq"] for f in waiting.values()).most_common(1)[0][0]
    op = Counter(f["op"] for f in waiting.values() if f["seq"] == seq).most_common(1)[0][0]
    for r in range(world_size):
        snap, flight = snapshots.get(r), waiting.get(r)
        if snap is None:
            ranks.append(_absent(r, exits))
        elif flight is not None and flight["seq"] == seq and flight["op"] == op:
            ranks.append({"rank": r, "state": "waiting", **_entry(flight)})
        elif flight is not None and flight["seq"] == seq:
            ranks.append({"rank": r, "state": "mismatch", **_entry(flight)})
        else:
            status = (snap.get("groups") or {}).get(group) or {"enqueued": 0}
            last = status["enqueued"]
            state = "ahead" if last > seq else "elsewhere"
            ranks.append({"rank": r, "state": state, "last_seq": last, "where": snap.get("where"), **_exit(r, exits)})
    return _finish(group, {"seq": seq, "op": op}, ranks, world_size, _records(snapshots))


def _records(snapshots: dict[int, dict[str, Any]]) -> list[str]:
    """What the ranks' records came from: 'flight recorder', 'lab record' (torch < 2.8 on gloo)."""
    return sorted({str(s["source"]) for s in snapshots.values() if s.get("source")})


def _entry(flight: dict[str, Any]) -> dict[str, Any]:
    return {k: flight.get(k) for k in ("op", "seq", "sizes", "dtypes", "where")}


def _exit(rank: int, exits: dict[int, str]) -> dict[str, Any]:
    return {"exit": exits[rank]} if rank in exits else {}


def _absent(rank: int, exits: dict[int, str]) -> dict[str, Any]:
    if rank in exits:
        return {"rank": rank, "state": "dead", "exit": exits[rank]}
    return {"rank": rank, "state": "silent"}


def _finish(
    group: str | None, at: dict[str, Any] | None, ranks: list[dict[str, Any]], world: int, records: list[str]
) -> dict[str, Any]:
    diagnosis = {"group": group, "collective": at, "world_size": world, "ranks": ranks, "records": records}
    diagnosis["summary"] = summary(diagnosis)
    return diagnosis


def _phrase(r: dict[str, Any], at: dict[str, Any] | None) -> str:
    state = r["state"]
    if state == "waiting":
        return f"waits in {r['op']} #{r['seq']} at {_where(r.get('where'))}"
    if state == "mismatch":
        others = f" where the others are in {at['op']} #{at['seq']}" if at else ""
        return f"is in {r['op']} #{r['seq']}{others}, at {_where(r.get('where'))}"
    if state == "elsewhere":
        never = "never came" if at else "was not in a collective"
        return f"{never} ({r['exit'] if r.get('exit') else 'at ' + _where(r.get('where'))})"
    if state == "ahead":
        return f"went on to #{r['last_seq']} (at {_where(r.get('where'))})"
    if state == "dead":
        return f"died ({r['exit']})"
    return "left no record (dead, or on a node whose folder this is not)"


def summary(diagnosis: dict[str, Any]) -> str:
    """One line: the ranks grouped by what they did, waiting ones first.

    >>> at = {"file": "t.py", "line": 5, "function": "main"}
    >>> print(summary({"group": "0", "collective": {"seq": 2, "op": "barrier"}, "ranks": [
    ...     {"rank": 0, "state": "waiting", "op": "barrier", "seq": 2, "where": at}, {"rank": 1, "state": "waiting",
    ...     "op": "barrier", "seq": 2, "where": at}, {"rank": 2, "state": "silent"}]}))
    ranks 0, 1 wait in barrier #2 at t.py:5 in main; rank 2 left no record (dead, or on a node whose folder this
    is not)
    """
    at, group = diagnosis.get("collective"), diagnosis.get("group")
    phrases: dict[str, list[int]] = {}
    for r in diagnosis["ranks"]:
        phrases.setdefault(_phrase(r, at), []).append(r["rank"])
    parts = []
    for phrase, who in sorted(phrases.items(), key=lambda kv: (not kv[0].startswith("wait"), kv[1])):
        name = f"rank {who[0]}" if len(who) == 1 else "ranks " + ", ".join(map(str, who))
        if len(who) > 1:
            phrase = phrase.replace("waits in", "wait in")
        if phrase.startswith("wait") and group != DEFAULT_GROUP:
            phrase = phrase.replace(" at ", f" of group {group} at ", 1)
        parts.append(f"{name} {phrase}")
    return "; ".join(parts)


def render(diagnosis: dict[str, Any], header: str) -> str:
    """The block a terminal shows: a header, then one line per rank."""
    at = diagnosis.get("collective")
    lines = [f"{header}: {diagnosis['summary']}"]
    for r in diagnosis["ranks"]:
        sizes = f" (sizes {r['sizes']})" if r.get("sizes") else ""
        lines.append(f"  rank {r['rank']:>3}: {_phrase(r, at)}{sizes}")
    if "lab record" in diagnosis.get("records", []):
        lines.append(
            "  (the lab's Python record: this torch has no Flight Recorder for the backend, so collectives made in "
            "C++, such as DDP's gradient all-reduce, are not in it; a rank 'never came' may wait in one)"
        )
    return "\n".join(lines)


def write(folder: Path, diagnosis: dict[str, Any]) -> Path:
    path = Path(folder) / DIAGNOSIS
    atomic.write_text(path, json.dumps(diagnosis, indent=1, default=str) + "\n")
    return path


def read(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(folder) / DIAGNOSIS).read_text())
    except (OSError, ValueError):
        return None


def torchrun_exits(lines: list[str]) -> dict[int, str]:
    """{global rank: why it ended} from torchrun's failure table (a rank killed by a signal raises nothing).

    >>> torchrun_exits(["  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 42)",
    ...                 "  traceback : Signal 9 (SIGKILL) received by PID 42", "  rank      : 0 (local_rank: 0)",
    ...                 "  exitcode  : 1 (pid: 41)", "  traceback : To enable traceback see: ..."])
    {1: 'Signal 9 (SIGKILL) received by PID 42', 0: 'exit code 1'}
    """
    exits: dict[int, str] = {}
    rank: int | None = None
    code = None
    for line in lines:
        found = re.match(r"^\s*(rank|exitcode|traceback)\s*:\s*(.+?)\s*$", line)
        if not found:
            continue
        key, value = found.groups()
        if key == "rank":
            rank, code = int(value.split()[0]), None
        elif key == "exitcode" and rank is not None:
            code = value.split()[0]
            exits[rank] = f"exit code {code}"
        elif key == "traceback" and rank is not None and value.startswith("Signal"):
            exits[rank] = value
    return exits


def after_failure(folder: Path, world_size: int, output_lines: list[str]) -> tuple[dict[str, Any], bool] | None:
    """A failed run's diagnosis from what its ranks left in `folder` and torchrun's failure table: (the diagnosis,
    whether a watchdog had already printed it), written to hang.json; None when nothing points at a hang (no
    rank left a record and none was killed)."""
    snapshots = read_snapshots(folder)
    exits = torchrun_exits(output_lines)
    earlier = read(folder)
    killed = {r: why for r, why in exits.items() if why.startswith("Signal")}
    if not snapshots and not killed:
        return None
    seen = bool(earlier and earlier.get("seen_by"))  # a watchdog named it while the collective waited
    world = max([world_size, *(int(s.get("world_size") or 0) for s in snapshots.values()), *(r + 1 for r in exits)])
    # read again: a rank slower to write than the watchdog's gathering is in it now, and a dead rank's exit too,
    # with where a fatal signal found it (lab.run.cluster.fault: gloo's abort on a mismatch runs no Python)
    dead = {r: _with_fault(folder, r, why) for r, why in exits.items() if r not in snapshots}
    diagnosis = diagnose(snapshots, world, dead)
    if not any(r["state"] in ("waiting", "mismatch", "dead") for r in diagnosis["ranks"]):
        return (earlier, True) if seen and earlier else None  # no rank was in a collective: an error, not a hang
    if seen and earlier:
        diagnosis["seen_by"] = earlier["seen_by"]
    write(folder, diagnosis)
    return diagnosis, seen


def say_after_failure(folder: Path, world_size: int, output_lines: list[str], who: str) -> str | None:
    """after_failure(), said: the block (or, where a watchdog printed it during the run, one line); None when
    there was no hang to name."""
    found = after_failure(folder, world_size, output_lines)
    if found is None:
        return None
    diagnosis, printed = found
    path = Path(folder) / DIAGNOSIS
    if printed:
        return f"{who}: the run ended in the hang named above ({path}): {diagnosis['summary']}"
    return render(diagnosis, f"{who}: the run failed in a collective ({path})")


def command(args: argparse.Namespace) -> int:
    """`lab hang DIR`: the diagnosis a failed or killed run left (its hang.json, else its ranks' records read
    again); exit 1 when DIR holds no record of a hang."""
    from lab.errors import LabError

    folder = Path(args.folder)
    if not folder.is_dir():
        raise LabError(f"{folder}: no such directory; give a run directory, or the folder a failed run named")
    diagnosis = read(folder)
    if diagnosis is None:
        snapshots = read_snapshots(folder)
        if snapshots:
            world = max(int(s.get("world_size") or 0) for s in snapshots.values())
            diagnosis = diagnose(snapshots, max(world, max(snapshots) + 1))
    if diagnosis is None:
        print(f"lab hang: {folder}: no rank left a record here ({DIAGNOSIS} or {SNAPSHOTS}/rank-N.json): no hang seen")
        return 1
    print(render(diagnosis, f"lab hang: {folder}"))
    if args.json:
        atomic.write_text(Path(args.json), json.dumps(diagnosis, indent=1, default=str) + "\n")
    return 0


def _with_fault(folder: Path, rank: int, why: str) -> str:
    from lab.run.cluster import fault

    where = fault.read(Path(folder) / SNAPSHOTS, rank) if why.startswith("Signal") else None
    return f"{why}, {where}" if where else why
