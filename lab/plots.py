"""The figures a command draws itself (`lab bench scaling|levers|strategies --plot`, `lab memory --plot`), and
the matplotlib plumbing every figure shares (lab.course.teaching.figures holds the report's own). No display needed.

Every figure says what was measured, in which units, on what: the caller passes a
`context` line (data source, device, world size) that goes under the title.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lab import optional

if TYPE_CHECKING:  # types only: matplotlib is optional, imported by the first figure
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


@functools.cache
def _pyplot() -> ModuleType:
    """matplotlib.pyplot, imported by the first figure: training and the device check run without matplotlib."""
    matplotlib = optional.require("matplotlib", "figures (lab report, lab memory, a benchmark's --plot)")
    matplotlib.use("Agg")  # files only; no display on servers and in CI
    import matplotlib.pyplot

    return matplotlib.pyplot


def require() -> None:
    """Exit 2 now, naming the package, when matplotlib is missing: a benchmark asked for a --plot checks before it
    runs, not after its measurements."""
    _pyplot()


class _Pyplot:
    """`plt.subplots(...)` as usual, but matplotlib is imported at the first call, inside the figure's function."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_pyplot(), name)


plt = _Pyplot()


def wrap(context: str) -> str:
    return "\n".join(textwrap.wrap(context, 90))


def finish(fig: Figure, ax: Axes, title: str, context: str, path: Path) -> Path:
    ax.set_title(f"{title}\n{wrap(context)}", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scaling(rows: list[dict[str, Any]], mode: str, context: str, path: Path, fit: dict[str, Any] | None = None) -> Path:
    """Throughput and speedup against N: measured points, the ideal, and (given `fit`, lab.scaling_laws'
    JSON form) the fitted law's curve with the other law at the same serial fraction for contrast."""
    from lab import scaling_laws

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
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
    top = max(n) * (8 if fit else 1)  # with a fit, draw the projection past the measured points
    grid = [1 + (top - 1) * i / 200 for i in range(201)]
    own = [r for r in rows if not r.get("oversubscribed")]
    shared = [r for r in rows if r.get("oversubscribed")]
    ax2.plot(
        [r["world_size"] for r in own],
        [r["speedup"] for r in own],
        "o",
        color="tab:orange",
        label="measured speedup",
        zorder=3,
    )
    if shared:
        ax2.plot(
            [r["world_size"] for r in shared],
            [r["speedup"] for r in shared],
            "o",
            mfc="none",
            color="tab:orange",
            label="measured, more processes than cores (not fitted)",
            zorder=3,
        )
    ax2.plot(grid, grid, linestyle="--", color="gray", label="ideal (N)")
    if fit:
        s = fit["serial_fraction"]
        for law in ("amdahl", "gustafson"):
            fitted = law == fit["law"]
            label = f"{law.capitalize()} fit, s = {s:.3f}" if fitted else f"{law.capitalize()} at the same s"
            ax2.plot(
                grid,
                [scaling_laws.LAWS[law](s, k) for k in grid],
                linestyle="-" if fitted else ":",
                color="tab:red" if fitted else "tab:purple",
                label=label,
            )
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log", base=2)
        from matplotlib.ticker import FuncFormatter

        ax2.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    else:
        ax2.set_xticks(n)
    ax2.set_xlabel("processes (world size)")
    ax2.set_ylabel("speedup = thr_N / thr_1")
    ax2.legend(fontsize=8)
    ax2.grid(True, alpha=0.3)
    ax2.set_title("Speedup and the scaling laws", fontsize=10)
    fig.suptitle(f"{mode.capitalize()} scaling of the training step\n{wrap(context)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_bars(rows: list[dict[str, Any]], device_gb: float | None, context: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["strategy"] for r in rows]
    bottom = [0.0] * len(rows)
    for part, color in (
        ("parameters", "tab:blue"),
        ("gradients", "tab:orange"),
        ("optimizer_states", "tab:green"),
        ("activations", "tab:gray"),
    ):
        values = [r.get(f"{part}_bytes", 0) / 1e9 for r in rows]
        if any(values):
            ax.bar(names, values, bottom=bottom, label=part.replace("_", " "), color=color)
            bottom = [b + v for b, v in zip(bottom, values)]
    if device_gb:
        ax.axhline(device_gb, color="red", linestyle="--", label=f"device memory {device_gb:g} GB")
    ax.set_ylabel("memory per device (GB, 1e9 bytes)")
    ax.legend()
    return finish(fig, ax, "Estimated memory per device by strategy", context, path)


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
    bars.scatter(
        names,
        [r["estimate_bytes"] / 2**20 for r in measured],
        color="black",
        marker="_",
        s=400,
        label="lab memory's estimate",
        zorder=3,
    )
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
    fig.suptitle(wrap(context), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def levers(result: dict[str, Any], path: Path) -> Path:
    """One figure: images/s and activation bytes of every lever as a ratio to the plain step (1.0 drawn),
    and beside them, on GPUs with 2+ ranks, each NCCL setting's busbw as a ratio to NCCL's own choice."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    g = result["groups"]
    timed = [("precision", g["precision"]), ("accumulation", g["accumulation"]["rows"]), ("buckets", g["buckets"])]
    nccl = [r for r in g["nccl"].get("rows", []) if r.get("ratio_to_default") is not None]
    panels = 3 if nccl else 2
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    colors = {"precision": "tab:blue", "accumulation": "tab:green", "buckets": "tab:orange"}
    plain_activations = result["plain"]["activation_bytes"]
    for ax, key, ylabel, title in (
        (axes[0], "ratio_to_plain", "images/s / plain's", "Throughput against the plain step"),
        (axes[1], "activation_ratio", "activation bytes / plain's", "Activations saved for backward"),
    ):
        labels, values, shades = [], [], []
        for group, rows in timed:
            for r in rows:
                labels.append(r["label"])
                values.append(
                    r["ratio_to_plain"] if key == "ratio_to_plain" else r["activation_bytes"] / plain_activations
                )
                shades.append(colors[group])
        bars = ax.bar(labels, values, color=shades)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.axhline(1.0, color="gray", linestyle="--")
        ax.set_ylim(0, max([1.0, *values]) * 1.15)  # room for the labels above the tallest bar
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(
        handles=[Patch(color=color, label=group) for group, color in colors.items()]
        + [Line2D([], [], color="gray", linestyle="--", label="plain = 1.0")],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.33),
        ncol=4,
    )  # below: never over a bar
    if nccl:
        bars = axes[2].bar([r["label"] for r in nccl], [r["ratio_to_default"] for r in nccl], color="tab:purple")
        axes[2].bar_label(bars, fmt="%.2f", fontsize=8)
        axes[2].axhline(1.0, color="gray", linestyle="--")
        axes[2].set_ylim(0, max(1.0, *(r["ratio_to_default"] for r in nccl)) * 1.15)
        axes[2].set_ylabel("average busbw / default's")
        axes[2].set_title("NCCL settings (all-reduce)", fontsize=10)
        axes[2].tick_params(axis="x", rotation=30, labelsize=8)
        axes[2].grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"The levers of a training step, as ratios to the plain step\n{wrap(result['context'])}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def prediction(rows: list[dict[str, Any]], context: str, path: Path) -> Path:
    """`lab predict --plot`: predicted and measured step time against ranks, the inputs marked apart."""
    fig, ax = plt.subplots(figsize=(7, 4))
    n = [r["world_size"] for r in rows]
    ax.plot(n, [r["measured_step_seconds"] * 1e3 for r in rows], marker="o", label="measured")
    ax.plot(n, [r["predicted_step_seconds"] * 1e3 for r in rows], marker="x", linestyle="--", label="predicted")
    inputs = [r for r in rows if r["input"]]
    if inputs:
        ax.axvspan(0.5, max(r["world_size"] for r in inputs) + 0.5, color="gray", alpha=0.15, label="measured inputs")
    ax.set_xlabel("ranks (world size)")
    ax.set_ylabel("step time (ms)")
    ax.set_xticks(n)
    ax.legend()
    return finish(fig, ax, "Predicted, then measured: the training step", context, path)
