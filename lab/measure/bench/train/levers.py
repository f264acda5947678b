"""The scaling lecture's levers, each a ratio against the plain DDP step measured in the same run.

    lab bench levers --nproc-per-node 2 --json levers.json --plot levers.png

One torchrun job builds a Trainer per variant of one config, all in one process group, on the same
synthetic data (every machine times the same work), with the same seed (the same initial weights
and the same batches, so their losses compare):

    plain           the config with train.amp=off, no accumulation, 25 MiB buckets, gradients as
                    bucket views: the step every other row is a ratio of
    precision       bf16 autocast; on CUDA also fp16 autocast with the GradScaler
    accumulation    one optimizer step from k micro-batches of B/k (k-1 under no_sync, the last
                    synced, each loss scaled 1/k), as the Trainer accumulates
    buckets         dist.bucket_cap_mb 1 and 100, and gradient_as_bucket_view=false

Every variant is warmed up, then each round times one block of steps of every variant, the order
reversed every other round, so slow drifts of the machine fall on all alike. A block's time is the
slowest rank's; a step's time is the median over the blocks, so one block disturbed by another
process moves nothing. A no_sync twin of each kind of compute (fp32, bf16, fp16, accumulated) runs
in the same rounds: the same step with no gradient all-reduce, so

    communication share = 1 - (twin's step time) / (the variant's step time)

is the part of a step spent waiting on communication (the plain step's twin serves the bucket rows,
whose compute is the plain step's).

Memory: `activation_bytes`, the bytes autograd saves for backward in one forward of one micro-batch
(what bf16 and accumulation shrink; counted, not sampled, so a CPU has it too); on CUDA
`peak_memory_bytes`, max_memory_allocated over the variant's blocks (the process holds every
variant's model, so it includes theirs), and `step_memory_bytes`, that peak above what was allocated
when the block began: the variant's own working memory.

Apart from the timing, accumulation is checked for exactness in float64 (the largest parameter
difference from one batch of B), and on GPUs with 2+ ranks the parent runs `lab bench allreduce`
once as NCCL chooses and once under each setting in NCCL_SETTINGS.

This module is the parent command: the variants and their config layers, the checks made before
torchrun starts, and the tables. The rest lives beside it:

    lab.measure.bench.train.levers_worker     the torchrun worker that builds the trainers and times them
    lab.measure.bench.comm.nccl_sweep        the NCCL variables' `lab bench allreduce` jobs
    lab.plots.levers            the figure

>>> rows = derive([{"label": "plain", "samples_per_second": 200.0}, {"label": "bf16", "samples_per_second": 300.0}])
>>> [r["ratio_to_plain"] for r in rows]
[1.0, 1.5]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.measure.bench.comm import nccl_sweep

MIB = 2**20


# ----------------------------------------------------------------------------- the variants


@dataclass(frozen=True)
class Variant:
    """One timed row: `overrides` are config sections over the plain config; `compute` names the no_sync
    twin that does the same compute without the all-reduce."""

    label: str
    group: str
    what: str
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    compute: str = "fp32"


def variants(device_type: str, accum_steps: int) -> list[Variant]:
    """The timed rows for a device, plain first.

    >>> [v.label for v in variants("cpu", 4)]
    ['plain', 'bf16', 'accum-4', 'bucket-1', 'bucket-100', 'no-bucket-view']
    >>> [v.label for v in variants("cuda", 2) if v.group == "precision"]
    ['bf16', 'fp16']
    """
    rows = [
        Variant("plain", "plain", "fp32, one batch per step, 25 MiB buckets, gradients as bucket views"),
        Variant("bf16", "precision", "bf16 autocast", {"train": {"amp": "bf16"}}, "bf16"),
    ]
    if device_type == "cuda":  # fp16 autocast is a GPU path; on a CPU the lab runs it in fp32 (lab.run.training.optim)
        rows.append(Variant("fp16", "precision", "fp16 autocast + GradScaler", {"train": {"amp": "fp16"}}, "fp16"))
    rows += [
        Variant(
            f"accum-{accum_steps}",
            "accumulation",
            f"{accum_steps} micro-batches per step, the first {accum_steps - 1} under no_sync",
            {"train": {"grad_accum_steps": accum_steps}},
            "accum",
        ),
        Variant("bucket-1", "buckets", "dist.bucket_cap_mb=1", {"dist": {"bucket_cap_mb": 1.0}}),
        Variant("bucket-100", "buckets", "dist.bucket_cap_mb=100", {"dist": {"bucket_cap_mb": 100.0}}),
        Variant(
            "no-bucket-view",
            "buckets",
            "dist.gradient_as_bucket_view=false",
            {"dist": {"gradient_as_bucket_view": False}},
        ),
    ]
    return rows


# The plain step: the config as given, without the levers this benchmark turns one at a time.
PLAIN: dict[str, dict[str, Any]] = {
    "train": {"amp": "off", "grad_accum_steps": 1},
    "dist": {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": True},
}
# Accumulation exactness: float64 leaves only rounding, and GroupNorm because BatchNorm normalises each
# micro-batch by its own statistics, so k micro-batches of B/k would compute a different function from one
# batch of B and no precision could make them agree.
EXACT: dict[str, dict[str, Any]] = {
    "model": {"dtype": "float64", "norm": "group", "sync_batchnorm": False},
    "train": {"amp": "off"},
}
# float64 rounding after a few steps is ~1e-16; a wrong scale or a missed micro-batch is ~1e-3 or more.
EQUAL_BELOW = 1e-10


def merged(*layers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Config overrides, later layers winning key by key.

    >>> merged({"train": {"amp": "off", "lr": 1}}, {"train": {"amp": "bf16"}, "dist": {"bucket_cap_mb": 1}})
    {'train': {'amp': 'bf16', 'lr': 1}, 'dist': {'bucket_cap_mb': 1}}
    """
    out: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            out[section] = {**out.get(section, {}), **values}
    return out


def as_sets(overrides: dict[str, dict[str, Any]]) -> list[str]:
    """The same overrides as `--set` items, so config.load validates a variant as it would a user's.

    >>> as_sets({"train": {"amp": "off"}, "dist": {"gradient_as_bucket_view": False}})
    ['train.amp=off', 'dist.gradient_as_bucket_view=false']
    """

    def show(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    return [f"{section}.{key}={show(value)}" for section, values in overrides.items() for key, value in values.items()]


def derive(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's images/s over the plain row's (the first)."""
    plain = rows[0]["samples_per_second"]
    return [{**r, "ratio_to_plain": round(r["samples_per_second"] / plain, 12)} for r in rows]


# ----------------------------------------------------------------------------- the parent


def run(args: argparse.Namespace) -> int:
    from lab.run import config
    from lab.run.cluster import cores, jobs, runner
    from lab.run.training import runs

    # torch (seconds to import) only when a default needs the GPU count: bad input is refused fast
    gpus = None if args.config and args.nproc_per_node else cores.gpu_count()
    # gpus is None only where --nproc-per-node was given
    n = args.nproc_per_node if gpus is None else args.nproc_per_node or cores.default_ranks(gpus)
    args.config = args.config or ("workshop-gpu" if gpus else "workshop-cpu")
    check_request(args, n)
    runner.check_processes(n, f"--nproc-per-node {n}")
    cfg = config.load(args.config, args.overrides)
    if args.plot:
        from lab import plots

        plots.require()  # matplotlib missing: exit 2 now, not after the measurements
    params = {
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "accum_steps": args.accum_steps,
        "equivalence_steps": args.equivalence_steps,
    }
    try:
        measured = jobs.run(jobs.Job("lab.measure.bench.train.levers_worker", n, params, cfg, reports=1))[0]
    except jobs.JobFailed as exc:
        print(exc.tail(), file=sys.stderr)
        print(f"levers: the torchrun job failed: {exc}", file=sys.stderr, flush=True)
        return 1
    nccl = nccl_sweep.nccl_group(n, measured["device_type"])
    result = summarize(measured, nccl, args, cfg.model.width, cores.threads_per_process(n))
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    if args.plot:
        from lab import plots  # matplotlib only when a figure is asked for

        plots.levers(result, Path(args.plot))
        print(f"plot: {args.plot}", flush=True)
    return 0


def check_request(args: argparse.Namespace, world_size: int) -> None:
    """Refuse, before torchrun starts, what a worker would fail on: one line naming the option or key. The
    variants checked are the GPU's, a superset of the CPU's."""
    from lab.run import config

    cfg = config.load(args.config, args.overrides)
    if cfg.dist.strategy != "ddp":
        raise LabError(
            f"dist.strategy: {cfg.dist.strategy}: lab bench levers measures DDP's levers (buckets, "
            f"no_sync); use dist.strategy=ddp, and lab bench strategies to compare FSDP and DeepSpeed"
        )
    config.check_layout(config.with_overrides(cfg, train={"grad_accum_steps": 1}), world_size)
    per_rank = cfg.train.global_batch_size // world_size
    k = args.accum_steps
    if per_rank % k:
        divisors = [d for d in range(2, per_rank + 1) if per_rank % d == 0][:6]
        fix = (
            f"use a divisor of {per_rank} such as {', '.join(map(str, divisors))}"
            if divisors
            else "use a larger train.global_batch_size"
        )
        raise LabError(
            f"--accum-steps {k}: the batch per rank, {per_rank} (train.global_batch_size "
            f"{cfg.train.global_batch_size} over {world_size} ranks), does not split into {k} equal "
            f"micro-batches; {fix}"
        )
    # Each variant as a user's --set would make it, so a combination the config refuses (static_graph with
    # accumulation) is refused here with the config's own sentence, and the lever named.
    exact = Variant("accumulation-equivalence", "", "", merged(EXACT, {"train": {"grad_accum_steps": k}}))
    for v in [*variants("cuda", k), exact]:
        try:
            config.check_layout(
                config.load(args.config, [*args.overrides, *as_sets(merged(PLAIN, v.overrides))]), world_size
            )
        except LabError as exc:
            raise LabError(f"the {v.label} lever: {exc}") from None


def summarize(
    measured: dict[str, Any], nccl: dict[str, Any], args: argparse.Namespace, width: int, threads: int
) -> dict[str, Any]:
    """The result the command prints, writes and plots, from the worker's measurements and the NCCL sweep."""
    rows = derive(measured["rows"])
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in rows[1:]:
        by_group.setdefault(r["group"], []).append(r)
    device = measured["device"]
    cpu = f", {measured['threads']} thread(s) per rank" if measured["device_type"] == "cpu" else ""
    context = (
        f"{measured['world_size']} rank(s) on {device}{cpu}, ResNet-18 width {width}, global batch "
        f"{measured['global_batch_size']} ({measured['batch_size_per_rank']} per rank), {measured['data']}, "
        f"{args.rounds} interleaved round(s) of {args.steps} step(s) after {args.warmup} warm-up"
    )
    return {
        "benchmark": "levers",
        "context": context,
        "world_size": measured["world_size"],
        "device": device,
        "device_type": measured["device_type"],
        "threads_per_process": threads if cpu else None,
        "model_width": width,
        "global_batch_size": measured["global_batch_size"],
        "batch_size_per_rank": measured["batch_size_per_rank"],
        "data": measured["data"],
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "accum_steps": args.accum_steps,
        "plain": rows[0],
        "groups": {
            "precision": by_group.get("precision", []),
            "accumulation": {"rows": by_group.get("accumulation", []), "equivalence": measured["equivalence"]},
            "buckets": by_group.get("buckets", []),
            "nccl": nccl,
        },
    }


# ----------------------------------------------------------------------------- output


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f} MiB"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _timed_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| lever | what | images/s | vs plain | step peak memory | activations | communication share | loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        loss = "-" if r.get("loss") is None else f"{r['loss']:.4f}"
        lines.append(
            f"| {r['label']} | {r['what']} | {r['samples_per_second']:.1f} | {r['ratio_to_plain']:.2f}x | "
            f"{_mib(r['step_memory_bytes'])} | {_mib(r['activation_bytes'])} | "
            f"{_share(r['communication_share'])} | {loss} |"
        )
    return lines


def render(result: dict[str, Any]) -> str:
    """The tables as Markdown: a text line, a blank line, a table, a blank line; no line starts with '#', so
    a report can embed it under its own headings.

    >>> row = {"label": "plain", "what": "fp32", "samples_per_second": 10.0, "ratio_to_plain": 1.0, "loss": 2.3,
    ...        "step_memory_bytes": None, "activation_bytes": 2**20, "communication_share": 0.25}
    >>> result = {"context": "2 ranks on cpu", "device_type": "cpu", "plain": row, "world_size": 2,
    ...           "groups": {"precision": [], "buckets": [], "accumulation": {"rows": [], "equivalence": {
    ...               "max_parameter_difference": 1e-16, "dtype": "float64", "norm": "group", "accum_steps": 4,
    ...               "batch_size_per_rank": 32, "optimizer_steps": 3}},
    ...                      "nccl": {"applicable": False, "reason": "gloo"}}}
    >>> print(render(result).splitlines()[6])
    | plain | fp32 | 10.0 | 1.00x | - | 1.0 MiB | 25.0% | 2.3000 |
    """
    g = result["groups"]
    plain = result["plain"]
    lines = [f"Levers of the training step: {result['context']}", ""]
    precision = "Precision: autocast over the plain fp32 step"
    if result["device_type"] != "cuda":
        precision += " (fp16 is a GPU path; on a CPU only bf16)"
    sections = [
        (precision, g["precision"]),
        ("Gradient accumulation: the same samples per optimizer step in micro-batches", g["accumulation"]["rows"]),
        (
            "DDP gradient buckets"
            if result["world_size"] > 1
            else "DDP gradient buckets (at world size 1 there is no DDP wrapper: these rows time the plain step "
            "again, so their spread is the noise of this run)",
            g["buckets"],
        ),
    ]
    for title, rows in sections:
        lines += [f"{title}:", "", *_timed_table([plain, *rows]), ""]
        if rows is g["accumulation"]["rows"]:
            e = g["accumulation"]["equivalence"]
            difference = e["max_parameter_difference"]
            verdict = "the same up to rounding" if difference < EQUAL_BELOW else "NOT the same"
            lines += [
                f"Accumulation against one batch: {e['accum_steps']} micro-batches of "
                f"{e['batch_size_per_rank'] // e['accum_steps']} and one batch of {e['batch_size_per_rank']} per "
                f"rank, {e['optimizer_steps']} optimizer steps in {e['dtype']} with {e['norm']} norm: largest "
                f"parameter difference {difference:.1e}, {verdict}",
                "",
            ]
    nccl = g["nccl"]
    if not nccl["applicable"]:
        lines += [f"NCCL settings: not measured: {nccl['reason']}.", ""]
    else:
        sizes: list[dict[str, Any]] = next((r["busbw_by_size"] for r in nccl["rows"] if "busbw_by_size" in r), [])
        lines += [
            "NCCL settings: all-reduce bus bandwidth (GB/s, out-of-place) under each variable:",
            "",
            "| setting | average busbw | vs default | " + " | ".join(f"{s['size'] // MIB} MiB" for s in sizes) + " |",
            "|---|---:|---:|" + "---:|" * len(sizes),
        ]
        for r in nccl["rows"]:
            if "error" in r:
                lines.append(f"| {r['label']} | {r['error']} | |" + " |" * len(sizes))
                continue
            ratio = "-" if r.get("ratio_to_default") is None else f"{r['ratio_to_default']:.2f}x"
            lines.append(
                f"| {r['label']} | {r['avg_busbw']:.1f} | {ratio} | "
                + " | ".join(f"{s['oop_busbw']:.1f}" for s in r["busbw_by_size"])
                + " |"
            )
        lines.append("")
    memory = (
        "step peak memory: CUDA's peak allocated during the variant's steps above what was resident when they started"
        if result["device_type"] == "cuda"
        else "step peak memory: '-' because the CPU allocator keeps no peak statistics"
    )
    comm = (
        "communication share = 1 - (the same step under no_sync) / (the step), each kind of compute against "
        "its own no_sync twin"
        if result["world_size"] > 1
        else "communication share: '-' at world size 1 (no all-reduce)"
    )
    lines += [
        f"images/s: global batch / step time, the median over the rounds' blocks of the slowest rank's "
        f"(a median, so one block disturbed by another process does not move a row); vs plain: images/s over "
        f"plain's; "
        f"{comm}; activations: bytes saved for backward by one forward of one micro-batch; {memory}; loss: "
        f"mean training loss of the last block (every variant trains on the same batches from the same "
        f"weights)"
    ]
    return "\n".join(lines)
