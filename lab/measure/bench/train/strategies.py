"""The same training under DDP, FSDP, DeepSpeed ZeRO-1/2/3 and Horovod, side by side: memory per rank, speed, loss.

    lab bench strategies --nproc-per-node 2 --json strategies.json --plot strategies.png
    lab bench strategies --nproc-per-node 2 --rows Horovod --steps 4     # DDP and Horovod only

Each strategy is its own torchrun job (horovodrun for Horovod) of the lab's Trainer on one config (model, data, global
batch,
seed): a few steps, the loss of each, images/s over the steps after the first, then one more
forward and backward so the gradients exist while this rank's bytes are counted (parameters,
gradients, optimizer state: a sharded tensor counts its local shard). Beside each count sits
`lab memory`'s estimate for the same strategy and world size (fp32 SGD with momentum, the lab's
recipe, counting what each tool keeps: DeepSpeed's fp32 master partition, FSDP2's in-place shards), and the
loss curve's largest relative difference from DDP's. The bucket DeepSpeed reduces through (its IPG bucket,
reduce_bucket_size from dist.bucket_cap_mb) is its own column, not in the state: what this rank holds of it
when the bytes are counted, beside the estimate's (ZeRO-3 keeps it all run, ZeRO-1 until the step, ZeRO-2 frees
it at the end of each backward).

On a CPU "peak" is the process's peak resident memory (Python, torch and the data set included), so
the parameter/gradient/optimizer split is the figure that shows sharding; on GPUs it is
torch.cuda.max_memory_allocated. DeepSpeed rows need the [deepspeed] extra, the Horovod row `make horovod`; without
them they say so.

>>> round(relative_gap({1: 2.0, 2: 1.0}, {1: 2.0, 2: 1.001, 3: 5.0}), 9)   # step 3: only one curve has it
0.001
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.errors import LabError

if TYPE_CHECKING:  # imported where used: `lab bench --help` must not wait for torch
    from lab.run.training.strategies.base import Strategy


def strategy_rows() -> list[tuple[str, str, int, str]]:
    """(label, dist.strategy, dist.zero_stage, lab memory's estimate row) of every row of every strategy in
    lab.run.config.strategies, in the table's order."""
    from lab.run.config.strategies import STRATEGIES

    return [(row.label, s.name, row.zero_stage, row.estimate) for s in STRATEGIES.values() for row in s.bench]


def chosen_rows(spec: str | None) -> list[tuple[str, str, int, str]]:
    """The rows `--rows` names (labels, comma-separated; any case), in the table's order; all when None. DDP's is
    kept whatever is named: every loss gap is measured from it.

    >>> [label for label, *_ in chosen_rows("horovod")]
    ['DDP', 'Horovod']
    """
    from lab.errors import LabError

    every = strategy_rows()
    if not spec:
        return every
    labels = {label.lower(): label for label, *_ in every}
    wanted = [item.strip().lower() for item in spec.split(",") if item.strip()]
    unknown = [item for item in wanted if item not in labels]
    if unknown or not wanted:
        raise LabError(
            f"--rows: {', '.join(unknown) or repr(spec)} is not a row; use labels among {', '.join(labels.values())}"
        )
    return [row for row in every if row[0].lower() in {*wanted, "ddp"}]


PARTS = ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes")


def relative_gap(reference: dict[int, float], other: dict[int, float]) -> float:
    """The largest |a - b| / |a| over the steps both curves have."""
    return max(abs(reference[s] - other[s]) / abs(reference[s]) for s in reference.keys() & other.keys())


def run(args: argparse.Namespace) -> int:
    from lab import plots
    from lab.run import config
    from lab.run.cluster import cores, jobs, runner
    from lab.run.training import runs

    if args.plot:
        plots.require()
    n = args.nproc_per_node or cores.default_ranks(cores.gpu_count())
    cfg = config.load(args.config or "smoke", args.overrides)
    config.check_layout(cfg, n)
    runner.check_processes(n, f"--nproc-per-node {n}")
    chosen = chosen_rows(getattr(args, "rows", None))
    rows = []
    for label, strategy, stage, _ in chosen:
        missing = _not_installed(strategy)
        if missing:
            rows.append({"label": label, "error": missing})
            continue
        # Each row's config as a user's --set would make it, its strategy's rules checked here: a row the rules
        # refuse is a failed row (the others still run), its reason the config's own line.
        try:
            row_cfg = config.load(
                args.config or "smoke", [*args.overrides, f"dist.strategy={strategy}", f"dist.zero_stage={stage}"]
            )
        except LabError as exc:
            rows.append({"label": label, "error": f"failed: {exc}"})
            continue
        job = jobs.Job(
            "lab.measure.bench.train.strategies",
            n,
            {"steps": args.steps},
            row_cfg,
            reports=1,
            launcher="horovodrun" if strategy == "horovod" else "torchrun",
        )
        try:
            rows.append({"label": label, **jobs.run(job)[0]})
        except jobs.JobFailed as exc:
            rows.append(failed_row(label, exc.output))
    result = summarize(rows, n, cfg.dist.bucket_cap_mb * 2**20)
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    if args.plot:
        plots.strategies(result["rows"], result["context"], Path(args.plot))
        print(f"plot: {args.plot}", flush=True)
    return 0 if all("error" not in r or "not installed" in r["error"] for r in rows) else 1


def failed_row(label: str, stderr: str) -> dict[str, str]:
    """A strategy whose job failed: the worker's exception line, not the banner torchrun prints after it.

    >>> failed_row("FSDP", "[rank0]: RuntimeError: out of memory\\nChildFailedError:\\n=====\\n")
    {'label': 'FSDP', 'error': 'failed: [rank0]: RuntimeError: out of memory'}
    """
    from lab.run.cluster.runner import last_error_line

    return {"label": label, "error": f"failed: {last_error_line(stderr)}"}


def summarize(rows: list[dict[str, Any]], world_size: int, bucket_bytes: float = 25 * 2**20) -> dict[str, Any]:
    """Add the estimate, its ratio and the loss gap from DDP to each measured row."""
    from lab.measure.sizing import memory

    measured = [r for r in rows if "error" not in r]
    ddp = next((r for r in measured if r["label"] == "DDP"), None)
    params = measured[0]["parameter_count"] if measured else 0
    estimates = {
        r["strategy"]: r
        for r in memory.estimate(params, world_size, *memory.MEASURED_RECIPE, bucket_bytes=bucket_bytes)
    }
    by_label = {label: est for label, _, _, est in strategy_rows()}
    for r in measured:
        r["losses"] = sorted([int(step), loss] for step, loss in dict(r["losses"]).items())  # JSON keeps pairs
    curve = {r["label"]: dict(r["losses"]) for r in measured}
    for r in measured:
        r["state_bytes"] = sum(r[p] for p in PARTS)
        r["estimate_bytes"] = estimates[by_label[r["label"]]]["total_bytes"]
        r["bucket_estimate_bytes"] = estimates[by_label[r["label"]]]["bucket_bytes"]
        r.setdefault("bucket_bytes", 0)  # a JSON of a worker before the bucket was counted
        r["measured_over_estimate"] = r["state_bytes"] / r["estimate_bytes"]
        r["rest_bytes"] = max(0, r["peak_bytes"] - r["state_bytes"])
        r["loss_gap_from_ddp"] = relative_gap(curve["DDP"], curve[r["label"]]) if ddp else None
    device = measured[0]["device"] if measured else "?"
    data, batch = (measured[0]["data"], measured[0]["global_batch_size"]) if measured else ("", "?")
    context = (
        f"ResNet-18 ({params / 1e6:.2f}M parameters), {world_size} ranks on {device}, {data}, global batch {batch}"
    )
    return {"benchmark": "strategies", "world_size": world_size, "context": context, "rows": rows}


def render(result: dict[str, Any]) -> str:
    mib = 2**20
    lines = [
        f"Strategies side by side: {result['context']}",
        "",
        "| strategy | parameters | gradients | optimizer state | state per rank | estimate | measured / "
        "estimate | bucket held (estimate) | peak (rest) | images/s | loss gap from DDP |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['error']} | | | | | | | | | |")
            continue
        gap = "-" if r["loss_gap_from_ddp"] is None else f"{r['loss_gap_from_ddp']:.1e}"
        lines.append(
            f"| {r['label']} | {r['parameters_bytes'] / mib:.2f} MiB | {r['gradients_bytes'] / mib:.2f} MiB | "
            f"{r['optimizer_states_bytes'] / mib:.2f} MiB | {r['state_bytes'] / mib:.2f} MiB | "
            f"{r['estimate_bytes'] / mib:.2f} MiB | {r['measured_over_estimate']:.2f} | "
            f"{r['bucket_bytes'] / mib:g} MiB ({r['bucket_estimate_bytes'] / mib:g}) | "
            f"{r['peak_bytes'] / mib:.0f} MiB ({r['rest_bytes'] / mib:.0f}) | {r['samples_per_second']:.0f} | "
            f"{gap} |"
        )
    lines += [
        "",
        "state = parameters + gradients + optimizer state held by one rank (a shard counts its own part); "
        "estimate: `lab memory` for fp32 SGD with momentum (DeepSpeed's fp32 master partition counted); "
        "bucket: DeepSpeed's IPG bucket held when counted (ZeRO-2 frees it after each backward), not in "
        "the state; loss gap: largest relative difference per step.",
    ]
    return "\n".join(lines)


def _not_installed(strategy: str) -> str | None:
    """Why an optional strategy's row cannot run here (its package is missing), or None."""
    import importlib.util

    if strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed is not installed (pip install '.[deepspeed]')"
    if strategy == "horovod":
        from lab.errors import LabError
        from lab.run.cluster import horovodrun

        try:
            horovodrun.check_installed()
        except LabError:
            return "Horovod is not installed (make horovod: third_party/horovod/build.sh)"
    return None


# ----------------------------------------------------------------------------- one strategy (a torchrun worker)


def worker(argv: list[str]) -> None:
    from lab.run import config, data
    from lab.run.cluster import dist, jobs
    from lab.run.training.trainer import Trainer, set_determinism

    job = jobs.this_job(argv)
    assert job.config is not None  # the parent hands its checked config down
    cfg = config.with_overrides(
        job.config,
        train={"max_steps": job.params["steps"], "log_every": 1},
        checkpoint={"save": False},
        metrics={"port_base": 0},
    )
    with dist.initialized(cfg.dist) as ctx:
        set_determinism(cfg.run.deterministic)
        dataset = data.load(cfg.data).to(ctx.device)
        losses: dict[int, float] = {}
        trainer = Trainer(
            cfg,
            ctx,
            dataset,
            hooks=[lambda row: losses.update({row["step"]: row["loss"]} if row["kind"] == "train" else {})],
        )
        results = trainer.fit()
        # One more forward and backward, no step: the gradients exist while the bytes are counted.
        trainer.forward_backward(*next(trainer.train_loader.forever()))
        split = {
            **trainer.strategy.memory_split(trainer.optimizer),
            "bucket_bytes": held_bucket_bytes(trainer.strategy),
        }
        if ctx.is_primary:
            from lab.run.cluster import provenance

            job.report(
                ctx.global_rank,
                {
                    **split,
                    "strategy": trainer.strategy.describe(),
                    "losses": losses,
                    "samples_per_second": results["samples_per_second"],
                    "peak_bytes": results["device_memory_peak_bytes"],
                    "parameter_count": sum(p.numel() for p in trainer.model.parameters()),
                    "device": provenance.describe(ctx)["device_name"],
                    "global_batch_size": cfg.train.global_batch_size,
                    "data": dataset.description.split(" (")[0],
                },
            )


def held_bucket_bytes(strategy: Strategy) -> int:
    """Bytes of DeepSpeed's IPG bucket buffers this rank holds now (stage 1/2: a list of buffers per dtype, emptied
    at the end of the backward at stage 2, in the step at stage 1; stage 3: one buffer per dtype, kept): 0 for DDP
    and FSDP, which have no such engine."""
    import torch

    zero = getattr(getattr(strategy, "engine", None), "optimizer", None)
    total = 0
    for bucket in getattr(zero, "ipg_buckets", {}).values():
        held = bucket.buffer if isinstance(bucket.buffer, (list, tuple)) else [bucket.buffer]
        total += sum(b.numel() * b.element_size() for b in held if torch.is_tensor(b))
    return total


if __name__ == "__main__":
    worker(sys.argv[1:])
