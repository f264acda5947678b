"""`lab report DIR...`: report.md and PNG plots from run directories and benchmark results.

A DIR is a run directory (it has manifest.json), a folder of them (a workshop), or
a benchmark result JSON (any benchmark with a section in lab.course.teaching.sections: `lab bench allreduce --json`,
`lab bench collective --json` (one file per op; all of them drawn in one plot), `lab bench scaling --json` in
either mode, `lab predict --json`, `lab memory --json`, `lab bench strategies --json`, `lab bench levers --json`);
folders are searched one level down for both. Each benchmark's section is lab.course.teaching.sections'. Every figure
says
what was measured, its units, and on what: data source, device, world size. The Markdown is what GitHub and
JupyterLab render: a blank line ends every table, and the report's title is its only top-level heading
(tests/unit/test_report_markdown.py parses it).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from lab import __version__
from lab.course.teaching import figures
from lab.course.teaching.sections import SECTIONS, belongs
from lab.course.teaching.sections import result_key as benchmark_key
from lab.errors import LabError
from lab.formatting import num, pct
from lab.run.cluster import hang
from lab.run.observability import horovod_timeline
from lab.run.training import runs, stragglers
from lab.verdict import FAILED, HELD, passes


def result_key(doc: dict[str, Any]) -> str | None:
    """What a result file holds, as the report files it; None for other JSON.

    >>> result_key({"benchmark": "scaling", "mode": "strong"}), result_key({"pitfall": "set-epoch"})
    ('scaling-strong', 'pitfall-set-epoch')
    >>> result_key({"benchmark": "collective", "collective": "all_gather"})
    'collective-all_gather'
    """
    if key := benchmark_key(doc):  # a benchmark's (lab.course.teaching.sections' rows say which files are whose)
        return key
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
    for name in paths:
        found_runs, found_files = _found(Path(name))
        run_dirs += found_runs
        benchmarks.update(_results(found_files))
    for run_dir in run_dirs:
        if not (run_dir / "summary.json").exists() or not (run_dir / "metrics.jsonl").exists():
            raise LabError(f"{run_dir}: summary.json or metrics.jsonl is missing; is the run finished?")
    if not run_dirs and not benchmarks:
        raise LabError(f"{', '.join(paths)}: no run directories or benchmark results found")
    return run_dirs, benchmarks


def _found(path: Path) -> tuple[list[Path], list[Path]]:
    """(run directories, JSON files) one DIR argument names: a result file, a run directory (with the fabric check
    beside it), or a folder of both, searched one level down."""
    if path.is_file():
        return [], [path]
    if (path / "manifest.json").exists():
        validate = path / "validate.json"  # a multi-node run's fabric check, beside its records
        return [path], [validate] if validate.exists() else []
    if path.is_dir():
        return sorted(p.parent for p in path.glob("*/manifest.json")), sorted(path.glob("*.json"))
    raise LabError(f"{path}: no such run directory or result file")


def _results(files: list[Path]) -> dict[str, dict[str, Any]]:
    """The results among `files` that the report shows, by result_key (other JSON left out)."""
    results: dict[str, dict[str, Any]] = {}
    for path in files:
        try:
            doc = runs.read_json(path)
        except (OSError, ValueError) as exc:
            raise LabError(f"{path}: not a readable result file ({exc})") from None
        if isinstance(doc, dict) and (key := result_key(doc)):
            results[key] = doc
    return results


def build(paths: list[str], out_dir: str | None = None) -> Path:
    run_dirs, benchmarks = collect(paths)
    out = Path(out_dir or (paths[0] if Path(paths[0]).is_dir() else Path(paths[0]).parent))
    out.mkdir(parents=True, exist_ok=True)
    sections = [
        f"# Report\n\nGenerated {datetime.datetime.now():%Y-%m-%d %H:%M} by lab {__version__} "
        f"(git {runs.git_revision() or 'unknown'}).\n"
    ]
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
    for name, section in SECTIONS.items():  # in the table's order, each benchmark's files in key order
        results = [benchmarks[key] for key in sorted(benchmarks) if belongs(key, name)]
        if results:
            sections.append(section.draw(results, out))
    report = out / "report.md"
    runs_text = "\n".join(sections)
    report.write_text(runs_text)
    return report


def _validate(result: dict[str, Any]) -> str:
    """The fabric check's validate.json (the playbook's validate role, or slurm/validate.sbatch): every all-reduce it
    ran against its floor, then the
    health readings, then what failed."""

    def busbw(value: Any) -> str:
        return "did not run" if value is None else f"{value:.3g}"

    where = "slurm/validate.sbatch" if result.get("platform") == "slurm" else "the validate role"
    judged = f" Judged: {result['judged']}." if result.get("judged") else ""
    lines = [
        "## Fabric validation",
        "",
        f"The fabric check ({where}) ran `lab bench allreduce`: {result['definitions']['busbw']}; "
        f"the floor is {result['definitions']['floor']}.{judged} Verdict: "
        f"{HELD if result['ok'] else FAILED}.",
        "",
        "| check | nodes | ranks | busbw (GB/s) | floor (GB/s) | verdict |",
        "|---|---|---:|---:|---:|---|",
    ]
    for node, record in result["nodes"].items():
        for pair in record["pairs"]:
            what = (
                "two CPU processes"
                if pair["pair"] == "cpu"
                # a Slurm job's node: all its GPUs at once
                else f"{'GPUs' if pair['pair'].count(',') > 1 else 'GPU pair'} {pair['pair']}"
            )
            ranks = 2 if pair["pair"] == "cpu" else pair["pair"].count(",") + 1
            judged = pair.get("busbw", pair["avg_busbw"])  # lab validate's figure at >= 1 GiB, else the average
            lines.append(
                f"| {what} | {node} | {ranks} | {busbw(judged)} | {pair['floor']:g} | "
                f"{HELD if pair['ok'] else FAILED + ': below'} |"
            )
    across = ([("all nodes", result["all_nodes"])] if result.get("all_nodes") else []) + list(result["ring"].items())
    for name, check in across:
        lines.append(
            f"| {'ring pair' if name != 'all nodes' else name} | {', '.join(check['hosts'])} | "
            f"{check['world_size']} | {busbw(check.get('busbw', check['avg_busbw']))} | "
            f"{check['floor']:g} | "
            f"{HELD if check['ok'] else FAILED + ': below'} |"
        )
    lines += [
        "",
        "| node | GPUs | platform | DCGM diagnostic | XID events since boot | uncorrected ECC errors |",
        "|---|---:|---|---|---|---|",
    ]
    for node, record in result["nodes"].items():
        health = record["health"]
        platform = record.get("platform", {}).get("key", "not judged")  # lab validate picks one per node
        lines.append(
            f"| {node} | {record['gpus']} | {platform} | {health['dcgm_diag']} | {health['xid_events']} | "
            f"{health['ecc_uncorrected']} |"
        )
    # the checks of the node's facts (lab validate) that did not pass (lab.verdict): failed, not run
    unsettled = [
        (node, c)
        for node, record in result["nodes"].items()
        for c in record.get("checks", [])
        if not passes(c["verdict"])
    ]
    if unsettled:
        lines += [
            "",
            "| node | check | verdict | detail |",
            "|---|---|---|---|",
            *[f"| {node} | {c['name']} | {c['verdict']} | {c['detail'].replace('|', '/')} |" for node, c in unsettled],
        ]
    lines.append("")
    if result["problems"]:
        lines += ["Problems:", "", *[f"- {problem}" for problem in result["problems"]], ""]
    return "\n".join(lines)


def _training(run_dirs: list[Path], out: Path) -> str:
    info = []
    for d in run_dirs:
        manifest, summary = runs.read_json(d / "manifest.json"), runs.read_json(d / "summary.json")
        info.append((d, manifest, summary))
    lines = [
        "## Training runs",
        "",
        "| run | world size | data | device | steps | final loss | test accuracy | images/s | status |",
        "|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for d, m, s in info:
        lines.append(
            f"| {d.name} | {m['world_size']} | {m['data']['source']} | {m['ranks'][0]['device_name']} | "
            f"{s['steps']} | {num(s.get('final_loss'), '.4f')} | {pct(s.get('test_accuracy'))} | "
            f"{num(s.get('samples_per_second'), '.0f')} | {s['status']} |"
        )
    data_sources = sorted({m["data"]["description"] for _, m, _ in info})
    devices = sorted({m["ranks"][0]["device_name"] for _, m, _ in info})
    context = f"data: {'; '.join(data_sources)} | device: {', '.join(devices)}"
    series = {
        f"{d.name} ({m['world_size']} rank{'s' if m['world_size'] > 1 else ''})": [
            (r["step"], r["loss"]) for r in runs.read_metrics(d)
        ]
        for d, m, _ in info
    }
    figures.loss_curves(series, context, out / "loss.png")
    throughput = {
        f"{d.name}\n({m['world_size']} x {m['ranks'][0]['device_name']})": s["samples_per_second"]
        for d, m, s in info
        if s.get("samples_per_second")
    }
    lines += ["", f"Data: {'; '.join(data_sources)}.", "", "![Training loss](loss.png)", ""]
    for d, m, s in info:
        hung = hang.read(d)  # a run that stalled or failed in a collective: who waited where (lab.run.cluster.hang)
        if hung:
            lines += [f"{d.name} hung: {hung['summary']} (`lab hang {d.name}` shows each rank's line).", ""]
        if s.get("slowest_rank") and s["slowest_rank"]["flagged"]:
            lines += [f"{d.name}: {stragglers.describe(s['slowest_rank'])}.", ""]
        if (d / "profile-summary.json").exists():
            p = runs.read_json(d / "profile-summary.json")
            trace = Path(_relative(d / p["trace"], out))
            lines += [
                f"Profile of {d.name} ({p['steps']} steps, {p['clock']} time): communication operators "
                f"{p['communication_us'] / 1e3:.1f} ms, everything else {p['compute_us'] / 1e3:.1f} ms "
                f"({p['communication_share']:.1%} communication); trace: [{trace}]({trace}) "
                f"(open in ui.perfetto.dev: DDP's all-reduce buckets overlap the backward pass).",
                "",
            ]
        if (d / horovod_timeline.FILE).exists():  # dist.strategy=horovod: the first steps' all-reduce phases
            steps = min(m["config"]["dist"].get("horovod_timeline_steps", 0), s["steps"])
            lines += horovod_timeline.render(horovod_timeline.summarise(d / horovod_timeline.FILE, steps), d.name)
    if throughput:
        figures.throughput_bars(throughput, context, out / "throughput.png")
        lines += ["![Training throughput](throughput.png)", ""]
    return "\n".join(lines)


def _comparison(result: dict[str, Any]) -> str:
    from lab.course.teaching import comparison

    return "\n".join(["## Baseline and DDP at one global batch", "", comparison.render(result), ""])


def _checkpoint(tour: dict[str, Any]) -> str:
    from lab.course.teaching import checkpoint_tour

    return "\n".join(
        [
            "## The baseline's checkpoint",
            "",
            checkpoint_tour.render(tour),
            "",
            "The baseline stopped there and resumed from this file: its loss curve above runs on through the resume.",
            "",
        ]
    )


def _pitfalls(results: list[dict[str, Any]], out: Path) -> str:
    from lab.course.pitfalls import PITFALLS
    from lab.course.pitfalls.command import render_table

    lines = [
        "## Pitfalls: the mistake, then the fix",
        "",
        "Each ran broken, then fixed, on the same ranks; `lab pitfall NAME` repeats one.",
        "",
    ]
    for r in sorted(results, key=lambda r: list(PITFALLS).index(r["pitfall"]) if r["pitfall"] in PITFALLS else 99):
        shown = (
            "skipped: " + r.get("reason", "")
            if r.get("skipped")
            else "demonstrated"
            if r["demonstrated"]
            else "NOT demonstrated in this run"
        )
        lines += [
            f"### {r['pitfall']} ({shown})",
            "",
            f"{PITFALLS.get(r['pitfall'], '')}. {r['world_size']} ranks on {r['device']}; {r['summary']}.",
            "",
        ]
        if r.get("table"):
            lines += [render_table(r["table"]), ""]
        lines += [f"- {note}" for note in r.get("notes", [])]
        lines += ["", f"Why: {r['why']}", ""]
    return "\n".join(lines)


def _relative(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path, start)
