"""Figures for benchmarks and reports (matplotlib, no display needed).

Every figure says what was measured, in which units, on what: the caller passes a
`context` line (data source, device, world size) that goes under the title.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402


def _wrap(context: str) -> str:
    return "\n".join(textwrap.wrap(context, 90))


def _finish(fig, ax, title: str, context: str, path: Path) -> Path:
    ax.set_title(f"{title}\n{_wrap(context)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_curves(series: dict[str, list[tuple[int, float]]], context: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in series.items():
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (cross-entropy, mean per sample)")
    ax.legend()
    return _finish(fig, ax, "Training loss at matching steps", context, path)


def throughput_bars(values: dict[str, float], context: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(list(values), list(values.values()), color="tab:blue")
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("training throughput (images/s)")
    return _finish(fig, ax, "Training throughput per run (after warm-up)", context, path)


def bus_bandwidth(rows: list[dict[str, Any]], link_gbps: float | None, link: str | None, context: str,
                  path: Path) -> Path:
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
    return _finish(fig, ax, "All-reduce bus bandwidth against message size", context, path)


def scaling(rows: list[dict[str, Any]], mode: str, context: str, path: Path) -> Path:
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    n = [r["world_size"] for r in rows]
    thr = [r["samples_per_second"] for r in rows]
    base = rows[0]["samples_per_second"] / rows[0]["world_size"]
    ax.plot(n, thr, marker="o", label="measured")
    ax.plot(n, [base * k for k in n], linestyle="--", color="gray", label="ideal (linear)")
    ax.set_xlabel("processes (world size)")
    ax.set_ylabel("training throughput (images/s)")
    ax.legend()
    ax.set_xticks(n)
    ax.grid(True, alpha=0.3)
    ax.set_title("Throughput", fontsize=10)
    ax2.plot(n, [r["efficiency"] for r in rows], marker="o", color="tab:orange", label="measured")
    ax2.axhline(1.0, linestyle="--", color="gray", label="ideal")
    ax2.set_ylim(0, 1.15)
    ax2.set_xticks(n)
    ax2.set_xlabel("processes (world size)")
    ax2.set_ylabel("efficiency = thr_N / (N thr_1)")
    ax2.legend()
    ax2.grid(True, alpha=0.3)
    ax2.set_title("Scaling efficiency", fontsize=10)
    fig.suptitle(f"{mode.capitalize()} scaling of the training step\n{_wrap(context)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_bars(rows: list[dict[str, Any]], device_gb: float | None, context: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["strategy"] for r in rows]
    bottom = [0.0] * len(rows)
    for part, color in (("parameters", "tab:blue"), ("gradients", "tab:orange"),
                        ("optimizer_states", "tab:green"), ("activations", "tab:gray")):
        values = [r.get(f"{part}_bytes", 0) / 1e9 for r in rows]
        if any(values):
            ax.bar(names, values, bottom=bottom, label=part.replace("_", " "), color=color)
            bottom = [b + v for b, v in zip(bottom, values)]
    if device_gb:
        ax.axhline(device_gb, color="red", linestyle="--", label=f"device memory {device_gb:g} GB")
    ax.set_ylabel("memory per device (GB, 1e9 bytes)")
    ax.legend()
    return _finish(fig, ax, "Estimated memory per device by strategy", context, path)


def strategies(rows: list[dict[str, Any]], context: str, path: Path) -> Path:
    """Measured bytes per rank by strategy (stacked: parameters, gradients, optimizer state), the estimate as
    a marker, and each strategy's loss curve beside."""
    measured = [r for r in rows if "error" not in r]
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(11, 4))
    names, bottom = [r["label"] for r in measured], [0.0] * len(measured)
    for part, color in (("parameters", "tab:blue"), ("gradients", "tab:orange"), ("optimizer_states", "tab:green")):
        values = [r[f"{part}_bytes"] / 2**20 for r in measured]
        bars.bar(names, values, bottom=bottom, label=part.replace("_", " "), color=color)
        bottom = [b + v for b, v in zip(bottom, values)]
    bars.scatter(names, [r["estimate_bytes"] / 2**20 for r in measured], color="black", marker="_", s=400,
                 label="lab memory's estimate", zorder=3)
    bars.set_ylabel("training state per rank (MiB)")
    bars.legend(fontsize=8)
    bars.set_title("Measured per rank", fontsize=10)
    for r in measured:  # losses: [step, loss] pairs
        curves.plot([s for s, _ in r["losses"]], [v for _, v in r["losses"]], marker=".", label=r["label"])
    curves.set_xlabel("optimizer step")
    curves.set_ylabel("training loss")
    curves.legend(fontsize=8)
    curves.set_title("Loss curves (each strategy, the same steps)", fontsize=10)
    for ax in (bars, curves):
        ax.grid(True, alpha=0.3)
    fig.suptitle(_wrap(context), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
