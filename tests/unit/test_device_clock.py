"""A benchmark's clock waits for the device: on NCCL (and CUDA generally) a call returns when it is enqueued, so a
host clock read around it alone times the launches (lab bench hang-record timed 500 NCCL all-reduces that way).
Every function of lab/measure/bench that reads time.perf_counter() must also wait for the device in it (a
synchronize, CUDA events) or time through lab.measure.bench.train.harness.timed, which does. Read from the source:
no GPU here, and the class of bug is a missing line, not a wrong number."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "lab" / "measure" / "bench"
WAITS = ("synchronize", "Event", "elapsed_time")


def host_clocks_without_a_device_wait(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
        clock = any(isinstance(c.func, ast.Attribute) and c.func.attr == "perf_counter" for c in calls)
        waits = any(isinstance(c.func, ast.Attribute) and c.func.attr in WAITS for c in calls)
        if clock and not waits:
            found.append(f"{node.name}:{node.lineno}")
    return found


def test_every_benchmark_clock_waits_for_the_device():
    wrong = {
        str(path.relative_to(BENCH.parents[2])): where
        for path in sorted(BENCH.rglob("*.py"))
        if path.name != "harness.py" and (where := host_clocks_without_a_device_wait(path.read_text()))
    }
    assert wrong == {}, f"host clocks around device work with no wait for the device: {wrong}"


def test_the_check_catches_the_hang_record_benchmarks_old_clock():
    old = """
def worker(ctx, calls, tiny):
    started = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce_sum(ctx, tiny)
    return (time.perf_counter() - started) / calls
"""
    assert host_clocks_without_a_device_wait(old) == ["worker:2"]
