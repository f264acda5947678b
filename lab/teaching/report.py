"""`lab report DIR...`: report.md and PNG plots from run directories and benchmark results.

A DIR is a run directory (it has manifest.json), a folder of them (a workshop), or
a benchmark result JSON (`lab bench allreduce --json`, `lab bench collective --json` (one file per op;
all of them drawn in one plot), `lab bench scaling --json` in either mode,
`lab memory --json`, `lab bench strategies --json`, `lab bench levers --json`); folders are searched one
level down for both. Every figure says what was measured, its units, and on what: data source, device,
world size. The Markdown is what GitHub and JupyterLab render: a blank line ends every table, and the
report's title is its only top-level heading (tests/unit/test_report_markdown.py parses it).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from lab import __version__, plots

from lab.training import runs
from lab.errors import LabError
from lab.formatting import num, pct


BENCHMARKS = ("allreduce", "scaling", "memory", "strategies", "levers")


def result_key(doc: dict[str, Any]) -> str | None:
    """What a result file holds, as the report files it; None for other JSON.

    >>> result_key({"benchmark": "scaling", "mode": "strong"}), result_key({"pitfall": "set-epoch"})
    ('scaling-strong', 'pitfall-set-epoch')
    >>> result_key({"benchmark": "collective", "collective": "all_gather"})
    'collective-all_gather'
    """
    if doc.get("benchmark") == "collective":  # one file per op: each its own result, drawn together
        return f"collective-{doc.get('collective')}"
    if doc.get("benchmark") in BENCHMARKS:
        # strong and weak scaling are two results of one benchmark
        return f"scaling-{doc.get('mode', 'weak')}" if doc["benchmark"] == "scaling" else doc["benchmark"]
    if "pitfall" in doc:
        return f"pitfall-{doc['pitfall']}"
    if "loss_at_matching_steps" in doc:  # the workshop's comparison
        return "comparison"
    if "loads_into_plain_model" in doc:  # the workshop's look into the baseline's checkpoint
        return "checkpoint"
    if doc.get("check") == "validate":  # the playbook's validate role (validate.json)
        return "validate"
    return None


def collect(paths: list[str]) -> tuple[list[Path], dict[str, dict[str, Any]]]:
    """(training run directories, benchmark results by kind) found under `paths`."""
    run_dirs: list[Path] = []
    benchmarks: dict[str, dict[str, Any]] = {}

    def add_json(path: Path) -> None:
        try:
            doc = runs.read_json(path)
        except (OSError, ValueError) as exc:
            raise LabError(f"{path}: not a readable result file ({exc})") from None
        if isinstance(doc, dict) and (key := result_key(doc)):
            benchmarks[key] = doc

    for name in paths:
        path = Path(name)
        if path.is_file():
            add_json(path)
        elif (path / "manifest.json").exists():
            run_dirs.append(path)
            validate = path / "validate.json"  # a multi-node run's fabric check, beside its records
            if validate.exists():
                add_json(validate)
        elif path.is_dir():
            run_dirs += sorted(p.parent for p in path.glob("*/manifest.json"))
            for candidate in sorted(path.glob("*.json")):
                add_json(candidate)
        else:
            raise LabError(f"{path}: no such run directory or result file")
    for run_dir in run_dirs:
        if not (run_dir / "summary.json").exists() or not (run_dir / "metrics.jsonl").exists():
            raise LabError(f"{run_dir}: summary.json or metrics.jsonl is missing; is the run finished?")
    if not run_dirs and not benchmarks:
        raise LabError(f"{', '.join(paths)}: no run directories or benchmark results found")
    return run_dirs, benchmarks


def build(paths: list[str], out_dir: str | None = None) -> Path:
    run_dirs, benchmarks = collect(paths)
    out = Path(out_dir or (paths[0] if Path(paths[0]).is_dir() else Path(paths[0]).parent))
    out.mkdir(parents=True, exist_ok=True)
    sections = [f"# Report\n\nGenerated {datetime.datetime.now():%Y-%m-%d %H:%M} by lab {__version__} "
                f"(git {runs.git_revision() or 'unknown'}).\n"]
    if "validate" in benchmarks:
        sections.append(_validate(benchmarks["validate"]))
    if run_dirs:
        sections.append(_training(run_dirs, out))
    if "comparison" in benchmarks:
        sections.append(_comparison(benchmarks["comparison"]))
    if "checkpoint" in benchmarks:
        sections.append(_checkpoint(benchmarks["checkpoint"]))
    pitfalls = [benchmarks[k] for k in benchmarks if k.startswith("pitfall-")]
    if pitfalls:
        sections.append(_pitfalls(pitfalls, out))
    if "allreduce" in benchmarks:
        sections.append(_allreduce(benchmarks["allreduce"], out))
    collectives = [benchmarks[k] for k in benchmarks if k.startswith("collective-")]
    if collectives:
        sections.append(_collectives(collectives, out))
    for mode in ("strong", "weak"):
        if f"scaling-{mode}" in benchmarks:
            sections.append(_scaling(benchmarks[f"scaling-{mode}"], out))
    if "levers" in benchmarks:
        sections.append(_levers(benchmarks["levers"], out))
    if "memory" in benchmarks:
        sections.append(_memory(benchmarks["memory"], out))
    if "strategies" in benchmarks:
        sections.append(_strategies(benchmarks["strategies"], out))
    report = out / "report.md"
    runs_text = "\n".join(sections)
    report.write_text(runs_text)
    return report


def _validate(result: dict[str, Any]) -> str:
    """The playbook's fabric check (validate.json): every all-reduce it ran against its floor, then the
    health readings, then what failed."""
    def busbw(value: Any) -> str:
        return "did not run" if value is None else f"{value:.3g}"

    lines = ["## Fabric validation", "",
             f"The validate role ran `lab bench allreduce` before the job: {result['definitions']['busbw']}; "
             f"the floor is {result['definitions']['floor']}. Verdict: "
             f"{'passed' if result['ok'] else 'FAILED'}.", "",
             "| check | nodes | ranks | busbw (GB/s) | floor (GB/s) | verdict |", "|---|---|---:|---:|---:|---|"]
    for node, record in result["nodes"].items():
        for pair in record["pairs"]:
            what = "two CPU processes" if pair["pair"] == "cpu" else f"GPU pair {pair['pair']}"
            lines.append(f"| {what} | {node} | 2 | {busbw(pair['avg_busbw'])} | {pair['floor']:g} | "
                         f"{'ok' if pair['ok'] else 'below'} |")
    across = ([("all nodes", result["all_nodes"])] if result.get("all_nodes") else []) + list(result["ring"].items())
    for name, check in across:
        lines.append(f"| {'ring pair' if name != 'all nodes' else name} | {', '.join(check['hosts'])} | "
                     f"{check['world_size']} | {busbw(check['avg_busbw'])} | {check['floor']:g} | "
                     f"{'ok' if check['ok'] else 'below'} |")
    lines += ["", "| node | GPUs | DCGM diagnostic | XID events since boot | uncorrected ECC errors |",
              "|---|---:|---|---|---|"]
    for node, record in result["nodes"].items():
        health = record["health"]
        lines.append(f"| {node} | {record['gpus']} | {health['dcgm_diag']} | {health['xid_events']} | "
                     f"{health['ecc_uncorrected']} |")
    lines.append("")
    if result["problems"]:
        lines += ["Problems:", "", *[f"- {problem}" for problem in result["problems"]], ""]
    return "\n".join(lines)


def _training(run_dirs: list[Path], out: Path) -> str:
    info = []
    for d in run_dirs:
        manifest, summary = runs.read_json(d / "manifest.json"), runs.read_json(d / "summary.json")
        info.append((d, manifest, summary))
    lines = ["## Training runs", "",
             "| run | world size | data | device | steps | final loss | test accuracy | images/s | status |",
             "|---|---:|---|---|---:|---:|---:|---:|---|"]
    for d, m, s in info:
        lines.append(f"| {d.name} | {m['world_size']} | {m['data']['source']} | {m['ranks'][0]['device_name']} | "
                     f"{s['steps']} | {num(s.get('final_loss'), '.4f')} | {pct(s.get('test_accuracy'))} | "
                     f"{num(s.get('samples_per_second'), '.0f')} | {s['status']} |")
    data_sources = sorted({m["data"]["description"] for _, m, _ in info})
    devices = sorted({m["ranks"][0]["device_name"] for _, m, _ in info})
    context = f"data: {'; '.join(data_sources)} | device: {', '.join(devices)}"
    series = {f"{d.name} ({m['world_size']} rank{'s' if m['world_size'] > 1 else ''})":
              [(r["step"], r["loss"]) for r in runs.read_metrics(d)] for d, m, _ in info}
    plots.loss_curves(series, context, out / "loss.png")
    throughput = {f"{d.name}\n({m['world_size']} x {m['ranks'][0]['device_name']})": s["samples_per_second"]
                  for d, m, s in info if s.get("samples_per_second")}
    lines += ["", f"Data: {'; '.join(data_sources)}.", "", "![Training loss](loss.png)", ""]
    for d, m, _ in info:
        if (d / "profile-summary.json").exists():
            p = runs.read_json(d / "profile-summary.json")
            trace = Path(_relative(d / p["trace"], out))
            lines += [f"Profile of {d.name} ({p['steps']} steps, {p['clock']} time): communication operators "
                      f"{p['communication_us'] / 1e3:.1f} ms, everything else {p['compute_us'] / 1e3:.1f} ms "
                      f"({p['communication_share']:.1%} communication); trace: [{trace}]({trace}) "
                      f"(open in ui.perfetto.dev: DDP's all-reduce buckets overlap the backward pass).", ""]
    if throughput:
        plots.throughput_bars(throughput, context, out / "throughput.png")
        lines += ["![Training throughput](throughput.png)", ""]
    return "\n".join(lines)


def _comparison(result: dict[str, Any]) -> str:
    from lab.teaching import comparison

    return "\n".join(["## Baseline and DDP at one global batch", "", comparison.render(result), ""])


def _checkpoint(tour: dict[str, Any]) -> str:
    from lab.teaching import checkpoint_tour

    return "\n".join(["## The baseline's checkpoint", "", checkpoint_tour.render(tour), "",
                      "The baseline stopped there and resumed from this file: its loss curve above runs on "
                      "through the resume.", ""])


def _pitfalls(results: list[dict[str, Any]], out: Path) -> str:
    from lab.pitfalls import PITFALLS
    from lab.pitfalls.command import render_table

    lines = ["## Pitfalls: the mistake, then the fix", "",
             "Each ran broken, then fixed, on the same ranks; `lab pitfall NAME` repeats one.", ""]
    for r in sorted(results, key=lambda r: list(PITFALLS).index(r["pitfall"]) if r["pitfall"] in PITFALLS else 99):
        shown = ("skipped: " + r.get("reason", "") if r.get("skipped") else
                 "demonstrated" if r["demonstrated"] else "NOT demonstrated in this run")
        lines += [f"### {r['pitfall']} ({shown})", "", f"{PITFALLS.get(r['pitfall'], '')}. {r['world_size']} ranks "
                  f"on {r['device']}; {r['summary']}.", ""]
        if r.get("table"):
            lines += [render_table(r["table"]), ""]
        lines += [f"- {note}" for note in r.get("notes", [])]
        lines += ["", f"Why: {r['why']}", ""]
    return "\n".join(lines)


def _allreduce(result: dict[str, Any], out: Path) -> str:
    devices = ", ".join(sorted(set(result.get("devices", [])))) or "unknown"
    context = (f"{result['world_size']} ranks, {result['backend']}, {result['dtype']} {result['op']}, "
               f"devices: {devices}")
    plots.bus_bandwidth(result["rows"], result.get("link_gbps"), result.get("link"), context, out / "allreduce.png")
    best = max(result["rows"], key=lambda r: r["ip_busbw"])
    lines = ["## All-reduce bus bandwidth", "",
             f"{context}. Average bus bandwidth {result['avg_busbw']:.3g} GB/s over {len(result['rows'])} sizes "
             f"(nccl-tests' definition: busbw = algbw x 2(n-1)/n); best in-place {best['ip_busbw']:.3g} GB/s "
             f"at {best['size']} B."]
    if result.get("link_gbps"):
        from lab.bench.collective_perf import link_share

        lines.append(f"Reference link {result['link']}: {result['link_gbps']:g} GB/s; the best size reaches "
                     f"{link_share(best['ip_busbw'], result['link_gbps'])}.")
    lines += ["", "![All-reduce bus bandwidth](allreduce.png)", ""]
    return "\n".join(lines)


def _collectives(results: list[dict[str, Any]], out: Path) -> str:
    """`lab bench collective` results: a table of each op's average and best busbw, one plot of busbw against
    size with a line per op."""
    from lab.bench.collective import COLLECTIVES, NAMES

    results = sorted(results, key=lambda r: NAMES.index(r["collective"]) if r["collective"] in NAMES else 99)
    setups = sorted({(r["world_size"], r["backend"], ", ".join(sorted(set(r.get("devices", [])))) or "unknown")
                     for r in results})
    context = "; ".join(f"{n} ranks, {backend}, devices: {devices}" for n, backend, devices in setups)
    plots.collectives_bus_bandwidth(results, context, out / "collectives.png")
    lines = ["## Collectives: bus bandwidth by operation", "",
             f"{context}. nccl-tests' definitions: algbw = size / time, busbw = algbw x the op's factor; the "
             f"average covers every size, out-of-place and in-place; #wrong counts elements that differ from "
             f"the exact result (N/A: in-place, where the op has no defined result).", "",
             "| collective | busbw factor | ranks | backend | type, op | sizes (B) | average busbw (GB/s) | "
             "best busbw (GB/s) | #wrong |",
             "|---|---|---:|---|---|---|---:|---:|---:|"]
    for r in results:
        rows = r["rows"]
        factor = COLLECTIVES[r["collective"]].factor_text if r["collective"] in COLLECTIVES else "?"
        sizes = f"{rows[0]['size']} to {rows[-1]['size']}" if rows else "none"
        best = max(rows, key=lambda row: max(row["oop_busbw"], row["ip_busbw"]), default=None)
        best_text = (f"{max(best['oop_busbw'], best['ip_busbw']):.3g} at {best['size']} B" if best else "n/a")
        wrong = sum(row["oop_wrong"] + (row["ip_wrong"] or 0) for row in rows)
        lines.append(f"| {r['collective']} | {factor} | {r['world_size']} | {r['backend']} | {r['dtype']} "
                     f"{r['op']} | {sizes} | {r['avg_busbw']:.3g} | {best_text} | {wrong} |")
    lines += ["", "![Bus bandwidth against size, one line per collective](collectives.png)", ""]
    return "\n".join(lines)


def _scaling(result: dict[str, Any], out: Path) -> str:
    from lab.bench import scaling

    mode = result["mode"]
    fitted = result.get("amdahl") or result.get("gustafson")
    plots.scaling(result["rows"], mode, result["context"], out / f"scaling-{mode}.png", fitted)
    lines = [f"## {mode.capitalize()} scaling", "",
             scaling.render(result["rows"], mode, result["context"], fitted, result.get("note")), "",
             f"![{mode.capitalize()} scaling](scaling-{mode}.png)", ""]
    if any(r.get("breakdown") for r in result["rows"][1:]):
        plots.step_breakdown(result["rows"], f"{mode} scaling, {result['context']}", out / f"step-time-{mode}.png")
        lines += [f"![Where a step's time goes, {mode} scaling](step-time-{mode}.png)", ""]
    return "\n".join(lines)


def _levers(result: dict[str, Any], out: Path) -> str:
    from lab.bench import levers

    plots.levers(result, out / "levers.png")
    return "\n".join(["## Levers: precision, accumulation, DDP buckets, NCCL", "", levers.render(result), "",
                      "![Each lever against the plain step](levers.png)", ""])


def _memory(result: dict[str, Any], out: Path) -> str:
    from lab.sizing import memory

    device_gb = result.get("device_memory_gb")
    plots.memory_bars(result["rows"], device_gb, result["title"], out / "memory.png")
    lines = ["## Memory per device", "", memory.render(result["rows"], result["title"],
                                                      device_gb * 1e9 if device_gb else None), ""]
    if result.get("recommendation"):
        lines += [f"Recommendation ({device_gb:g} GB per device): {result['recommendation']}", ""]
    lines += ["![Memory per device](memory.png)", ""]
    if "measured" in result:
        lines += [memory.render_measured(result["measured"]), ""]
    return "\n".join(lines)


def _strategies(result: dict[str, Any], out: Path) -> str:
    from lab.bench import strategies

    plots.strategies(result["rows"], result["context"], out / "strategies.png")
    return "\n".join(["## Strategies side by side", "", strategies.render(result), "",
                      "![Memory per rank and loss curves by strategy](strategies.png)", ""])


def _relative(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path, start)
