"""`lab validate`'s input and figures: its options (--floor, --expect, --nodes) parsed into one line per mistake,
the result files of DIR read, and an all-reduce result's judged bus bandwidth."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.machine.health import fabric_checks

FLOOR_KEYS = ("node", "pair", "nodes", "host_device", "d2d")
FLOOR_ALIASES = {"gpu_pair": "pair", "cpu_pair": "pair"}  # the validate role's old keys
JUDGED_FROM_BYTES = 1 << 30  # 1 GiB: inter-node bandwidth peaks at 1-8 GiB; smaller sizes are latency-bound
LOG_TAIL_BYTES = 65536  # enough for a last line; a long job's log is not read whole


# ----------------------------------------------------------------------------- input


def _split_scoped(option: str, item: str) -> tuple[str, str, str]:
    """ "[NODE:]KEY=VALUE" -> (NODE or "", KEY, VALUE)."""
    scoped, equals, value = item.partition("=")
    if not equals:
        raise LabError(f"{option} {item!r}: expected [NODE:]KEY=VALUE, e.g. {option} nodes=300")
    node, _, key = scoped.rpartition(":")
    return node.strip(), key.strip(), value.strip()


def parse_floors(items: list[str]) -> dict[str, dict[str, float]]:
    """--floor [NODE:]KEY=GBPS (repeatable): {"" (every node) or NODE: {KEY: GB/s}}; a bad item is one line."""
    wanted = (
        f"expected [NODE:]KEY=GBPS with KEY one of {', '.join(FLOOR_KEYS)} and GBPS a number >= 0, "
        f"e.g. --floor node=400 or --floor dgx02:nodes=150"
    )
    floors: dict[str, dict[str, float]] = {}
    for item in items:
        node, key, value = _split_scoped("--floor", item) if "=" in item else ("", item, "")
        key = FLOOR_ALIASES.get(key, key)
        if key not in FLOOR_KEYS:
            raise LabError(f"--floor {item!r}: unknown key {key!r}; {wanted}")
        try:
            gbps = float(value)
        except ValueError:
            raise LabError(f"--floor {item!r}: {value!r} is not a number; {wanted}") from None
        if not math.isfinite(gbps) or gbps < 0:
            raise LabError(f"--floor {item!r}: {value!r} is not a finite number >= 0; {wanted}")
        floors.setdefault(node, {})[key] = gbps
    return floors


def parse_expect(items: list[str]) -> dict[str, dict[str, Any]]:
    """--expect [NODE:]KEY=VALUE (repeatable): what a node should have, over its platform's table."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        node, key, value = _split_scoped("--expect", item)
        if key not in fabric_checks.EXPECT_KEYS:
            keys = "; ".join(f"{k}: {v}" for k, v in fabric_checks.EXPECT_KEYS.items())
            raise LabError(f"--expect {item!r}: unknown key {key!r}; expected one of {keys}")
        out.setdefault(node, {})[key] = _expect_value(item, key, value)
    return out


def _expect_value(item: str, key: str, value: str) -> Any:
    wanted = fabric_checks.EXPECT_KEYS[key]
    if key in ("gpus", "xid_max", "ib_ports", "pcie_gen", "pcie_width") and value.isdigit():
        return int(value)
    if key == "ib_rate" and re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    if key == "ib_width" and re.fullmatch(r"\d+X", value.upper()):
        return value.upper()
    if (key, value) in {
        ("gdrdma", "yes"),
        ("gdrdma", "no"),
        ("journal", "required"),
        ("journal", "skip"),
        ("dcgm", "required"),
        ("dcgm", "skip"),
    }:
        return value
    raise LabError(f"--expect {item!r}: {value!r} is not valid for {key}; expected {wanted}")


def parse_nodes(text: str) -> list[str]:
    """--nodes n1,n2: the nodes in order (the first is the head); each names its files in DIR."""
    nodes = [name.strip() for name in text.split(",")]
    if not all(nodes) or any("/" in name for name in nodes):
        raise LabError(f"--nodes {text!r}: expected node names separated by commas, e.g. --nodes dgx01,dgx02")
    if len(set(nodes)) != len(nodes):
        raise LabError(f"--nodes {text!r}: a node is named twice; name each node once")
    return nodes


def _folder(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise LabError(
            f"DIR {str(path)!r}: no such folder; expected the fabric check's folder of facts-NAME/, "
            f"node-NAME.json and nodes.json results"
        )
    return folder


def _result(
    path: Path, keys: tuple[str, ...] = ("rows", "avg_busbw", "world_size"), what: str = "`lab bench allreduce --json`"
) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON, None), or (None, why there is none) when it is missing or not such a result."""
    if not path.exists():
        return None, None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"{path.name}: not readable JSON ({exc})"
    missing = [key for key in keys if not isinstance(doc, dict) or key not in doc]
    if missing:
        return None, f"{path.name}: not a {what} result (no {', '.join(missing)})"
    return doc, None


def last_line(path: Path) -> str | None:
    """The last non-empty line of a log (read from its tail), None when there is no such file."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"{path.name} is empty")


def _why_missing(folder: Path, stem: str, unreadable: str | None) -> str:
    line = last_line(folder / f"{stem}.log")
    if unreadable:
        return unreadable + (f"; {stem}.log: {line}" if line else "")
    return line if line is not None else f"no {stem}.json and no {stem}.log"


# ----------------------------------------------------------------------------- figures


def wrong_elements(doc: dict[str, Any]) -> int:
    """#wrong over every size, out-of-place and in-place (in-place is null where it is not checked)."""
    return sum(row["oop_wrong"] + (row.get("ip_wrong") or 0) for row in doc["rows"])


def judged_busbw(doc: dict[str, Any]) -> tuple[float, str]:
    """(the busbw judged, at which sizes): the median over sizes >= 1 GiB, else the largest size, said so."""

    def best(row: dict[str, Any]) -> float:
        return max(value for value in (row.get("oop_busbw"), row.get("ip_busbw")) if value is not None)

    rows = sorted(doc["rows"], key=lambda row: row["size"])
    if not rows:
        return float(doc["avg_busbw"]), "no rows: the run's average"
    large = [row for row in rows if row["size"] >= JUDGED_FROM_BYTES]
    if large:
        return statistics.median(
            best(row) for row in large
        ), f"median of {len(large)} size(s) {_size(large[0]['size'])}-{_size(large[-1]['size'])}"
    return best(rows[-1]), f"largest size {_size(rows[-1]['size'])} (the run had none >= 1 GiB)"


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def on_gpus(doc: dict[str, Any]) -> bool:
    """Whether the run was on GPUs: collective_perf records each rank's device name ("cpu" on a CPU)."""
    devices = doc.get("devices") or []
    return any(name != "cpu" for name in devices) if devices else doc.get("backend") == "nccl"


def describe_pair(pair: str) -> str:
    """What a pairs entry measured ("GPU pair 0,1"; "GPUs ..." over more than two)."""
    if pair == "cpu":
        return "two CPU processes"
    return f"GPUs {pair}" if pair.count(",") > 1 else f"GPU pair {pair}"


def _shortfall(busbw: float, floor: float, wrong: int, source: str) -> str:
    said = f" ({source})" if source.startswith("baseline") or source.startswith("--floor") else ""
    if busbw < floor:
        return f"busbw {busbw:.3g} GB/s, below its floor {floor:g} GB/s{said}" + (
            f" (and {wrong} wrong elements)" if wrong else ""
        )
    return f"{wrong} wrong elements (busbw {busbw:.3g} GB/s, floor {floor:g} GB/s)"
