"""A healthy cluster's figures as `lab validate`'s baseline: `--record-baseline FILE` writes them from a run that
passed, `--baseline FILE` makes a fraction of each (--baseline-fraction, default 0.8) the floor of the same figure.

    {"check": "validate-baseline", "run_id": "v1",
     "nodes": {"dgx01": {"platform": "h100-sxm-8", "node": 471.2, "host_device": 53.1}, ...},
     "platforms": {"h100-sxm-8": {"node": 470.8, "host_device": 53.0}},     # the median over its nodes
     "all_nodes": {"busbw": 381.0, "world_size": 16, "hosts": ["dgx01", "dgx02"]}}

A node named in the baseline is held to its own figures; another node to its platform's median; the all-nodes
figure to the recorded one (recorded on as many nodes or fewer, so a bigger job is not held to a smaller one's).

>>> floor_from({"nodes": {}, "platforms": {"cpu": {"node": 0.5}}}, "x", "cpu", "node", 0.8)
(0.4, 'baseline: 0.8 x 0.5 GB/s (platform cpu)')
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from lab import atomic
from lab.errors import LabError

FIGURES = ("node", "host_device")


def read(path: str) -> dict[str, Any]:
    """The baseline file, or one line naming what is wrong with it."""
    wanted = "expected the JSON `lab validate --record-baseline FILE` writes"
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise LabError(f"--baseline {path!r}: cannot read it ({exc.strerror or exc}); {wanted}") from None
    except ValueError as exc:
        raise LabError(f"--baseline {path!r}: not JSON ({exc}); {wanted}") from None
    if (
        not isinstance(doc, dict)
        or doc.get("check") != "validate-baseline"
        or not isinstance(doc.get("nodes"), dict)
        or not isinstance(doc.get("platforms"), dict)
    ):
        raise LabError(
            f'--baseline {path!r}: not a baseline (no "check": "validate-baseline" with nodes and platforms); {wanted}'
        )
    for where, figures in [*doc["nodes"].items(), *doc["platforms"].items()]:
        for key, value in figures.items():
            if key != "platform" and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise LabError(f"--baseline {path!r}: {where}.{key} is {value!r}; expected a figure > 0 (GB/s)")
    return doc


def parse_fraction(text: str) -> float:
    try:
        fraction = float(text)
    except ValueError:
        fraction = math.nan
    if not 0 < fraction <= 1:
        raise LabError(
            f"--baseline-fraction {text!r}: expected a number in (0, 1], e.g. 0.8 (fail under 80% of the baseline)"
        )
    return fraction


def floor_from(
    baseline: dict[str, Any], node: str, platform: str, key: str, fraction: float
) -> tuple[float, str] | None:
    """(the floor, where it came from) for `key` of `node` from the baseline, None when it has no such figure."""
    own = baseline["nodes"].get(node, {})
    if key in own and own.get("platform") in (None, platform):
        return fraction * own[key], f"baseline: {fraction:g} x {own[key]:g} GB/s (node {node})"
    shared = baseline["platforms"].get(platform, {})
    if key in shared:
        return fraction * shared[key], f"baseline: {fraction:g} x {shared[key]:g} GB/s (platform {platform})"
    return None


def all_nodes_floor(baseline: dict[str, Any], world_size: int, fraction: float) -> tuple[float, str] | None:
    recorded = baseline.get("all_nodes") or {}
    if not recorded.get("busbw") or recorded.get("world_size", 0) > world_size:
        return None
    return fraction * recorded[
        "busbw"
    ], f"baseline: {fraction:g} x {recorded['busbw']:g} GB/s ({recorded.get('world_size')} ranks)"


def record(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """Write the baseline of a passed verdict `doc` (validate.json's document) to `path`; refuse a failed one."""
    if not doc["ok"]:
        raise LabError(
            f"--record-baseline {path!r}: not written: this run has {len(doc['problems'])} problem(s); "
            f"a baseline is a healthy cluster's figures (fix them, or waive with --expect, and run again)"
        )
    nodes: dict[str, dict[str, Any]] = {}
    for name, record_ in doc["nodes"].items():
        figures: dict[str, Any] = {"platform": record_["platform"]["key"]}
        judged = [pair["busbw"] for pair in record_["pairs"] if pair.get("busbw")]
        if judged:
            figures["node"] = min(judged)
        copies = (record_.get("hostdevice") or {}).get("min_gbps")
        if copies:
            figures["host_device"] = copies
        nodes[name] = figures
    platforms: dict[str, dict[str, float]] = {}
    for key in {figures["platform"] for figures in nodes.values()}:
        platforms[key] = {
            figure: statistics.median(values)
            for figure in FIGURES
            if (values := [f[figure] for f in nodes.values() if f["platform"] == key and figure in f])
        }
    across = doc.get("all_nodes")
    baseline = {
        "check": "validate-baseline",
        "run_id": doc["run_id"],
        "nodes": nodes,
        "platforms": platforms,
        "all_nodes": {"busbw": across["busbw"], "world_size": across["world_size"], "hosts": across["hosts"]}
        if across and across.get("busbw")
        else None,
    }
    atomic.write_text(path, json.dumps(baseline, indent=2) + "\n")
    return baseline
