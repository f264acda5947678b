"""The report's own figures (lab.plots holds those a command draws with --plot): loss curves and throughput of
the workshop's runs, bus bandwidth against size, where a step's time goes. No display needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.plots import finish, plt


def loss_curves(series: dict[str, list[tuple[int, float]]], context: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in series.items():
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (cross-entropy, mean per sample)")
    ax.legend()
    return finish(fig, ax, "Training loss at matching steps", context, path)


def throughput_bars(values: dict[str, float], context: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(list(values), list(values.values()), color="tab:blue")
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("training throughput (images/s)")
    return finish(fig, ax, "Training throughput per run (after warm-up)", context, path)


def bus_bandwidth(
    rows: list[dict[str, Any]], link_gbps: float | None, link: str | None, context: str, path: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = [r["size"] for r in rows]
    ax.plot(sizes, [r["oop_busbw"] for r in rows], marker="o", label="out-of-place busbw")
    ax.plot(sizes, [r["ip_busbw"] for r in rows], marker="s", label="in-place busbw")
    if link_gbps:
        ax.axhline(link_gbps, color="gray", linestyle="--", label=f"{link}: {link_gbps:g} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s, 1e9 bytes)")
    ax.legend()
    return finish(fig, ax, "All-reduce bus bandwidth against message size", context, path)


def collectives_bus_bandwidth(results: list[dict[str, Any]], context: str, path: Path) -> Path:
    """Bus bandwidth against size, a line per `lab bench collective` result: out-of-place solid, in-place
    dotted in the same colour."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(results):
        color, rows = f"C{i % 10}", r["rows"]
        sizes = [row["size"] for row in rows]
        ax.plot(sizes, [row["oop_busbw"] for row in rows], marker="o", color=color, label=r["collective"])
        ax.plot(sizes, [row["ip_busbw"] for row in rows], linestyle=":", color=color)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes, as nccl-tests counts it per collective)")
    ax.set_ylabel("bus bandwidth (GB/s, 1e9 bytes)")
    ax.legend(fontsize=8, title="solid: out-of-place, dotted: in-place", title_fontsize=8)
    return finish(fig, ax, "Collectives: bus bandwidth against size", context, path)


def step_breakdown(rows: list[dict[str, Any]], context: str, path: Path) -> Path:
    """Where a step's time goes at each world size: compute (forward + backward), the rest of a step
    without communication (optimizer, zeroing, batch slicing), and the communication not hidden."""
    parts = (
        ("compute_seconds", "forward + backward", "tab:blue"),
        ("other_seconds", "optimizer and the rest", "tab:green"),
        ("exposed_communication_seconds", "exposed communication", "tab:red"),
    )
    shown = [r for r in rows if r.get("breakdown")]
    labels = [f"N = {r['world_size']}" for r in shown]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(shown)
    for key, label, color in parts:
        values = [r["breakdown"][key] * 1e3 for r in shown]
        ax.bar(labels, values, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("milliseconds per training step")
    ax.set_ylim(0, max(bottom, default=1.0) * 1.35)  # room for the legend above the bars
    ax.legend(fontsize=8)
    return finish(fig, ax, "Where a training step's time goes", context, path)
