"""Each benchmark's section of `lab report`: its figure and its Markdown, from its result files.

SECTIONS, in the course's order, names a benchmark's section by the "benchmark" field of its result JSON; each takes
that benchmark's results (every file the report kept for it, in key order: scaling's strong before weak) and the
report's folder, where the PNGs go. The Markdown follows the report's rules: `## ` headings under its one title, a
blank line after every table. A benchmark without a row here is not in the report: showing a result is the
teaching layer's decision, not the benchmark's.

>>> result_key({"benchmark": "scaling", "mode": "strong"}), result_key({"benchmark": "pipeline"})
('scaling-strong', None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import plots
from lab.course.teaching import figures


def _allreduce(result: dict[str, Any], out: Path) -> str:
    devices = ", ".join(sorted(set(result.get("devices", [])))) or "unknown"
    context = f"{result['world_size']} ranks, {result['backend']}, {result['dtype']} {result['op']}, devices: {devices}"
    figures.bus_bandwidth(result["rows"], result.get("link_gbps"), result.get("link"), context, out / "allreduce.png")
    best = max(result["rows"], key=lambda r: r["ip_busbw"])
    lines = [
        "## All-reduce bus bandwidth",
        "",
        f"{context}. Average bus bandwidth {result['avg_busbw']:.3g} GB/s over {len(result['rows'])} sizes "
        f"(nccl-tests' definition: busbw = algbw x 2(n-1)/n); best in-place {best['ip_busbw']:.3g} GB/s "
        f"at {best['size']} B.",
    ]
    if result.get("link_gbps"):
        from lab.measure.bench.comm.collective_perf import link_share

        lines.append(
            f"Reference link {result['link']}: {result['link_gbps']:g} GB/s; the best size reaches "
            f"{link_share(best['ip_busbw'], result['link_gbps'])}."
        )
    lines += ["", "![All-reduce bus bandwidth](allreduce.png)", ""]
    return "\n".join(lines)


def collectives(results: list[dict[str, Any]], out: Path) -> str:
    """`lab bench collective` results: a table of each op's average and best busbw, one plot of busbw against
    size with a line per op."""
    from lab.measure.bench.comm.collective import COLLECTIVES, NAMES

    results = sorted(results, key=lambda r: NAMES.index(r["collective"]) if r["collective"] in NAMES else 99)
    setups = sorted(
        {(r["world_size"], r["backend"], ", ".join(sorted(set(r.get("devices", [])))) or "unknown") for r in results}
    )
    context = "; ".join(f"{n} ranks, {backend}, devices: {devices}" for n, backend, devices in setups)
    figures.collectives_bus_bandwidth(results, context, out / "collectives.png")
    lines = [
        "## Collectives: bus bandwidth by operation",
        "",
        f"{context}. nccl-tests' definitions: algbw = size / time, busbw = algbw x the op's factor; the "
        f"average covers every size, out-of-place and in-place; #wrong counts elements that differ from "
        f"the exact result (N/A: in-place, where the op has no defined result).",
        "",
        "| collective | busbw factor | ranks | backend | type, op | sizes (B) | average busbw (GB/s) | "
        "best busbw (GB/s) | #wrong |",
        "|---|---|---:|---|---|---|---:|---:|---:|",
    ]
    for r in results:
        rows = r["rows"]
        factor = COLLECTIVES[r["collective"]].factor_text if r["collective"] in COLLECTIVES else "?"
        sizes = f"{rows[0]['size']} to {rows[-1]['size']}" if rows else "none"
        best = max(rows, key=lambda row: max(row["oop_busbw"], row["ip_busbw"]), default=None)
        best_text = f"{max(best['oop_busbw'], best['ip_busbw']):.3g} at {best['size']} B" if best else "n/a"
        wrong = sum(row["oop_wrong"] + (row["ip_wrong"] or 0) for row in rows)
        lines.append(
            f"| {r['collective']} | {factor} | {r['world_size']} | {r['backend']} | {r['dtype']} "
            f"{r['op']} | {sizes} | {r['avg_busbw']:.3g} | {best_text} | {wrong} |"
        )
    lines += ["", "![Bus bandwidth against size, one line per collective](collectives.png)", ""]
    return "\n".join(lines)


def _scaling(result: dict[str, Any], out: Path) -> str:
    from lab.measure.bench.train import scaling

    mode = result["mode"]
    fitted = result.get("amdahl") or result.get("gustafson")
    plots.scaling(result["rows"], mode, result["context"], out / f"scaling-{mode}.png", fitted)
    lines = [
        f"## {mode.capitalize()} scaling",
        "",
        scaling.render(result["rows"], mode, result["context"], fitted, result.get("note")),
        "",
        f"![{mode.capitalize()} scaling](scaling-{mode}.png)",
        "",
    ]
    if any(r.get("breakdown") for r in result["rows"][1:]):
        figures.step_breakdown(result["rows"], f"{mode} scaling, {result['context']}", out / f"step-time-{mode}.png")
        lines += [f"![Where a step's time goes, {mode} scaling](step-time-{mode}.png)", ""]
    return "\n".join(lines)


def _predict(result: dict[str, Any], out: Path) -> str:
    """`lab predict --json`: predicted beside measured per world size with the error, the assumptions each with its
    source, the projection past this machine, and predicted against measured step time drawn."""
    rows = result["rows"]
    plots.prediction(rows, result["context"], out / "predict.png")
    inputs = [r["world_size"] for r in rows if r["input"]]
    checked = [r for r in rows if not r["input"]]
    worst = max(checked, key=lambda r: r["error"], default=None)
    lines = [
        "## Scaling predicted, then measured",
        "",
        f"{result['context']}. The step was measured on {_ranks(inputs)}, predicted from those runs on more ranks "
        "with lab.measure.prediction's model, and then measured there too (docs/prediction.md); error = |predicted - "
        "measured| / measured."
        + (
            f" Largest error where the model was not fed the answer: {worst['error']:.1%} at {worst['world_size']} "
            "ranks."
            if worst
            else " No world size past the inputs was measured: nothing here checks the model."
        ),
        "",
        "| ranks | predicted step (ms) | measured step (ms) | error | predicted images/s | measured images/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['world_size']} | {r['predicted_step_seconds'] * 1e3:.1f} | {r['measured_step_seconds'] * 1e3:.1f} "
            f"| {r['error']:.1%}{' (input)' if r['input'] else ''} | {r['predicted_samples_per_second']:.1f} "
            f"| {r['measured_samples_per_second']:.1f} |"
        )
    lines += [
        "",
        "The assumptions, each with where its number came from:",
        "",
        "| assumption | value | source |",
        "|---|---:|---|",
        *(
            f"| {a['name']} | {a['value']:.4g}{' ' + a['unit'] if a['unit'] else ''} | {a['source']} |"
            for a in result.get("assumptions", [])
        ),
        "",
        "![Step time predicted and measured against ranks](predict.png)",
        "",
    ]
    projection = result.get("projection") or {}
    if projection.get("rows"):
        lines += [
            f"The same step projected past this machine on {projection['platform']}'s links (weak scaling):",
            "",
            "| GPUs | nodes | strategy | step (ms) | exposed communication (ms) | efficiency |",
            "|---:|---:|---|---:|---:|---:|",
            *(
                f"| {p['world_size']} | {p['nodes']} | {p['strategy']} | {p['step_seconds'] * 1e3:.1f} | "
                f"{p['exposed_communication_seconds'] * 1e3:.2f} | {p['efficiency']:.1%} |"
                for p in projection["rows"]
            ),
            "",
        ]
    return "\n".join(lines)


def _ranks(sizes: list[int]) -> str:
    """>>> _ranks([1, 2]), _ranks([1]), _ranks([])
    ('1 and 2 ranks', '1 rank', 'no ranks')
    """
    if not sizes:
        return "no ranks"
    if len(sizes) == 1:
        return f"{sizes[0]} rank{'s' if sizes[0] > 1 else ''}"
    return f"{', '.join(map(str, sizes[:-1]))} and {sizes[-1]} ranks"


def _levers(result: dict[str, Any], out: Path) -> str:
    from lab.measure.bench.train import levers

    plots.levers(result, out / "levers.png")
    return "\n".join(
        [
            "## Levers: precision, accumulation, DDP buckets, NCCL",
            "",
            levers.render(result),
            "",
            "![Each lever against the plain step](levers.png)",
            "",
        ]
    )


def _memory(result: dict[str, Any], out: Path) -> str:
    from lab.measure.sizing import memory

    device_gb = result.get("device_memory_gb")
    plots.memory_bars(result["rows"], device_gb, result["title"], out / "memory.png")
    lines = [
        "## Memory per device",
        "",
        memory.render(result["rows"], result["title"], device_gb * 1e9 if device_gb else None),
        "",
    ]
    if result.get("recommendation"):
        lines += [f"Recommendation ({device_gb:g} GB per device): {result['recommendation']}", ""]
    lines += ["![Memory per device](memory.png)", ""]
    if "measured" in result:
        lines += [memory.render_measured(result["measured"]), ""]
    return "\n".join(lines)


def _strategies(result: dict[str, Any], out: Path) -> str:
    from lab.measure.bench.train import strategies

    plots.strategies(result["rows"], result["context"], out / "strategies.png")
    return "\n".join(
        [
            "## Strategies side by side",
            "",
            strategies.render(result),
            "",
            "![Memory per rank and loss curves by strategy](strategies.png)",
            "",
        ]
    )


def _each(render: Callable[[dict[str, Any], Path], str]) -> Callable[[list[dict[str, Any]], Path], str]:
    """A section of one block per result file, in the report's order."""
    return lambda results, out: "\n".join(render(result, out) for result in results)


@dataclass(frozen=True)
class Section:
    draw: Callable[[list[dict[str, Any]], Path], str]  # (the benchmark's results, the report's folder) -> Markdown
    part: Callable[[dict[str, Any]], str] | None = None  # a result that is one of several: which (scaling's mode)


# In the course's order; `lab memory`'s result is a section like a benchmark's.
SECTIONS: dict[str, Section] = {
    "allreduce": Section(_each(_allreduce)),
    "collective": Section(collectives, part=lambda doc: str(doc.get("collective"))),
    "scaling": Section(_each(_scaling), part=lambda doc: str(doc.get("mode", "weak"))),
    "predict": Section(_each(_predict)),
    "levers": Section(_each(_levers)),
    "memory": Section(_each(_memory)),
    "strategies": Section(_each(_strategies)),
}


def result_key(doc: dict[str, Any]) -> str | None:
    """The key a benchmark's result files under in the report (one per file the report keeps), None when no
    section shows it."""
    name = doc.get("benchmark")
    section = SECTIONS.get(name) if isinstance(name, str) else None
    if section is None:
        return None
    return f"{name}-{section.part(doc)}" if section.part else str(name)


def belongs(key: str, name: str) -> bool:
    """Whether the result filed under `key` is one of benchmark `name`'s."""
    return key == name or (SECTIONS[name].part is not None and key.startswith(f"{name}-"))
