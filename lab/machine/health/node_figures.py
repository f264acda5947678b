"""One node's own figures in `lab validate`, each judged against the node's floors: its all-reduce over all its GPUs
(or two CPU processes), its GPU pairs where they ran, its host<->device copies. Each shortfall is a problem that
names the node; lab.machine.health.validate_node gives the floors.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lab.machine.health.validate_input import (
    _result,
    _shortfall,
    _why_missing,
    describe_pair,
    judged_busbw,
    on_gpus,
    wrong_elements,
)
from lab.measure import platforms as table


def node_allreduce(
    folder: Path,
    name: str,
    doc: dict[str, Any] | None,
    unreadable: str | None,
    like: dict[str, Any] | None,
    floors: dict[str, float],
    sources: dict[str, str],
    platform: table.Platform,
    problems: list[str],
) -> dict[str, Any]:
    """The node's all-reduce over all its GPUs (or two CPU processes) against its node floor."""
    shape = doc or like
    gpus = (shape["world_size"] if on_gpus(shape) else 0) if shape else None
    pair = ("cpu" if gpus == 0 else ",".join(map(str, range(gpus)))) if gpus is not None else "all"
    key = "pair" if pair == "cpu" else "node"
    entry: dict[str, Any] = {
        "pair": pair,
        "rc": None,
        "avg_busbw": None,
        "busbw": None,
        "judged_at": None,
        "floor": floors[key],
        "ok": False,
        "error": None,
    }
    what = f"{name}: all-reduce of {describe_pair(pair)}"
    if doc is None:
        entry["error"] = _why_missing(folder, f"node-{name}", unreadable)
        problems.append(f"{what}: no result: {entry['error']}")
        return entry
    busbw, at = judged_busbw(doc)
    wrong = wrong_elements(doc)
    entry.update(
        avg_busbw=doc["avg_busbw"], busbw=busbw, judged_at=at, wrong=wrong, ok=wrong == 0 and busbw >= floors[key]
    )
    if not entry["ok"]:
        hint = " (NVLS off, an NVLink down or the fabric manager?)" if platform.nvswitch and busbw < floors[key] else ""
        problems.append(f"{what}: {_shortfall(busbw, floors[key], wrong, sources[key])}{hint}")
    return entry


PAIR_FILE = re.compile(r"^pair-(?P<node>.+)-(?P<i>\d+)-(?P<j>\d+)\.json$")


def gpu_pairs(
    folder: Path, name: str, floors: dict[str, float], sources: dict[str, str], problems: list[str]
) -> list[dict[str, Any]]:
    """The node's GPU pairs, where they were run (pair-NAME-I-J.json)."""
    entries = []
    found = sorted(
        (int(m["i"]), int(m["j"]), path)
        for path in folder.glob(f"pair-{name}-*-*.json")
        if (m := PAIR_FILE.match(path.name)) and m["node"] == name
    )
    for i, j, path in found:
        doc, unreadable = _result(path)
        pair = f"{i},{j}"
        entry: dict[str, Any] = {
            "pair": pair,
            "rc": None,
            "avg_busbw": None,
            "busbw": None,
            "judged_at": None,
            "floor": floors["pair"],
            "ok": False,
            "error": unreadable,
        }
        if doc is None:
            problems.append(f"{name}: all-reduce of GPU pair {pair}: no result: {unreadable}")
        else:
            busbw, at = judged_busbw(doc)
            wrong = wrong_elements(doc)
            entry.update(
                avg_busbw=doc["avg_busbw"],
                busbw=busbw,
                judged_at=at,
                wrong=wrong,
                ok=wrong == 0 and busbw >= floors["pair"],
            )
            if not entry["ok"]:
                problems.append(
                    f"{name}: all-reduce of GPU pair {pair}: "
                    f"{_shortfall(busbw, floors['pair'], wrong, sources['pair'])}"
                )
        entries.append(entry)
    return entries


def hostdevice(
    folder: Path,
    name: str,
    floors: dict[str, float],
    sources: dict[str, str],
    platform: table.Platform,
    problems: list[str],
) -> dict[str, Any] | None:
    """hostdevice-NAME.json (lab bench hostdevice): each GPU's pinned copies against host_device, the
    device-to-device copies against d2d where a floor is set."""
    stem = f"hostdevice-{name}"
    doc, unreadable = _result(folder / f"{stem}.json", ("gpus", "d2d_gbps"), "`lab bench hostdevice --json`")
    if doc is None:
        if unreadable or (folder / f"{stem}.log").exists():
            why = _why_missing(folder, stem, unreadable)
            problems.append(f"{name}: host<->device copies: no result: {why}")
            return {"ok": False, "error": why}
        return None
    if doc.get("device") == "cpu" or platform.key == "cpu":
        return {"ok": True, "device": "cpu", "min_gbps": None, "note": "CPU copies: not judged"}
    floor = floors.get("host_device")
    low = []
    figures = [value for gpu in doc["gpus"] for value in (gpu.get("h2d_gbps"), gpu.get("d2h_gbps")) if value]
    for gpu in doc["gpus"]:
        for direction in ("h2d", "d2h"):
            value = gpu.get(f"{direction}_gbps")
            if floor is not None and (value is None or value < floor):
                low.append(f"GPU {gpu['index']} {direction} {value if value is None else f'{value:.3g}'} GB/s")
    if low:
        problems.append(
            f"{name}: host<->device copies below their floor {floor:g} GB/s: {', '.join(low)} "
            f"(a PCIe link trained down?)"
        )
    d2d_low = []
    if "d2d" in floors:
        for i, row in enumerate(doc["d2d_gbps"]):
            d2d_low += [f"{i}->{j} {value:.3g} GB/s" for j, value in enumerate(row) if i != j and value < floors["d2d"]]
        if d2d_low:
            problems.append(
                f"{name}: device-to-device copies below their floor {floors['d2d']:g} GB/s: {', '.join(d2d_low)}"
            )
    return {
        "ok": not low and not d2d_low,
        "method": doc.get("method"),
        "device": doc.get("device"),
        "min_gbps": min(figures) if figures else None,
        "floor": floor,
        "below": low + d2d_low,
        "gpus": doc["gpus"],
        "d2d_gbps": doc["d2d_gbps"],
    }
