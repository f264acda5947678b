"""`lab pitfall [NAME]`: list the pitfalls, or run one broken then fixed and print what was measured.

Every pitfall module has `measure(world_size) -> dict` (it picks its own device: GPUs where every rank has one,
else the CPU) with these keys (the --json record):

    pitfall, world_size, device   what ran where
    broken, fixed                 the measurements (fixed: one dict, or one per fix)
    demonstrated                  True only when the symptom showed in the broken run and not in the fixed
    summary                       one line: the numbers that say it
    why                           the lecture's explanation, one paragraph
    table                         {"columns": [...], "rows": [[label, cell, ...], ...]}: what is printed
    notes                         lines printed under the table (what was skipped, what did not show)

Exit 0 whether or not the symptom showed (the output says which); 1 when a job crashed or hung.

>>> print(render_table({"columns": ["broken", "fixed"], "rows": [["repeats", "100%", "0%"]]}))
|         | broken | fixed |
|---------|--------|-------|
| repeats | 100%   | 0%    |
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
import time
from typing import Any

from lab.course.pitfalls import PITFALLS, module_name
from lab.errors import EXIT_FAILED, EXIT_OK, LabError
from lab.run.cluster import runner

NEEDS_ONE_RANK = {"cuda-visible-devices"}  # the others compare ranks: one rank shows nothing


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        print(listing())
        return EXIT_OK
    from lab.course.pitfalls import workers

    world_size = args.nproc_per_node or workers.default_world_size()
    if world_size < 2 and args.name not in NEEDS_ONE_RANK:
        raise LabError(f"--nproc-per-node {world_size}: pitfall {args.name} compares ranks, so it needs 2 or more")
    runner.check_processes(world_size, f"--nproc-per-node {world_size}")  # before any job starts
    started = time.monotonic()
    try:
        result = importlib.import_module(module_name(args.name)).measure(world_size)
    except workers.JobFailed as exc:
        print(f"lab pitfall {args.name}: failed: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    print(render(result), flush=True)
    if args.json:
        from lab.run.training import runs

        runs.write_json(args.json, result)
    return EXIT_OK


def listing() -> str:
    """Every pitfall and what it shows, in the lecture's order."""
    width = max(map(len, PITFALLS))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in PITFALLS.items()]
    return "\n".join(["Pitfalls (lab pitfall NAME runs one: the mistake, then the fix, measured):", *lines])


def render(result: dict[str, Any]) -> str:
    if result.get("skipped"):
        verdict = "demonstrated: no (skipped)"
    elif result["demonstrated"]:
        verdict = "demonstrated: yes"
    else:
        verdict = "demonstrated: NO - the symptom did not show as expected in this run"
    lines = [
        f"lab pitfall {result['pitfall']}: {PITFALLS[result['pitfall']]}",
        f"{result['world_size']} ranks on {result['device']}, {result.get('wall_seconds', '?')} s",
        "",
    ]
    if result.get("table"):
        lines += [render_table(result["table"]), ""]
    lines += [f"- {note}" for note in result.get("notes", [])]
    lines += [f"{verdict}: {result['summary']}", "", *textwrap.wrap("Why: " + result["why"], 100)]
    return "\n".join(lines)


def render_table(table: dict[str, Any]) -> str:
    """A Markdown table, columns padded to their widest cell so it reads in a terminal too."""
    rows = [["", *table["columns"]], *[[str(cell) for cell in row] for row in table["rows"]]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"

    return "\n".join([line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows[1:])])
