"""`lab predict`: measure the training step on 1..K ranks, predict it on more, measure those too, read the gap.

    lab predict --config smoke --measure-up-to 2 --check-up-to 4 --json predict.json --plot predict.png

Each world size is a torchrun job of `lab bench scaling`'s worker (weak scaling: the batch per rank fixed, the same
threads per rank at every N): the step, the step under no_sync and forward + backward alone, and, with 2+ ranks,
an all-reduce of all the gradients' bytes and one of 4 bytes. From the 1- and K-rank jobs:

    compute, the rest      the 1-rank step split (forward + backward; the optimizer and the rest)
    latency alpha          the 4-byte all-reduce on K ranks / 2(K-1)
    bus bandwidth B        2(K-1)/K S / (the gradients' all-reduce - 2(K-1) alpha)
    overlap                1 - (measured exposed - pipelined exposed) / (all-reduce - pipelined exposed), on K ranks
    DDP's own cost         the K-rank step less everything above (never hidden, the same at every larger N)
    processors             this machine's cores (CPU ranks beyond them take turns), or a device per rank

then lab.measure.prediction.model predicts every N, and the larger N are measured to compare. Projections past this
machine (8, 64, 512 GPUs) use a platform table's node and NIC bandwidth (lab.measure.platforms) with this step.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from lab import scaling_laws
from lab.errors import LabError
from lab.measure.prediction import model
from lab.measure.prediction import rows as rows_table
from lab.measure.prediction.model import Assumption, Link


def inputs_from(one: dict[str, Any], many: dict[str, Any], cores: int | None, threads: int) -> model.Inputs:
    """The model's inputs from a 1-rank and a K-rank measurement (lab.measure.bench.train.scaling's worker rows)."""
    k = many["world_size"]
    here = f"measured here, {k} ranks"
    grads = float(many["gradient_bytes"])
    alpha = many["allreduce_4_bytes_seconds"] / (2 * (k - 1))
    whole = many["allreduce_gradients_seconds"]
    bandwidth_seconds = whole - 2 * (k - 1) * alpha
    if bandwidth_seconds < 0.1 * whole:
        # the gradients' all-reduce barely outlasted (or undercut) 4 bytes': noise, or gradients so few that latency
        # is all there is; read the bandwidth from the whole call rather than from a difference of two noises
        bandwidth_seconds = whole
    bus = 2 * (k - 1) / k * grads / bandwidth_seconds
    # Compute from the K-rank job, whose ranks shared this machine as the larger jobs will (1 rank: the reference),
    # brought back to one rank's share of it; the larger N take their turns from there (model.compute_slowdown).
    shared = max(1.0, k * threads / cores) if cores else 1.0
    compute = many["compute_step_seconds"] / shared
    other = max(0.0, many.get("other_step_seconds", 0.0)) / shared
    bucket = float(many.get("bucket_cap_mb", 25.0)) * model.MIB
    base = model.Inputs(
        compute_seconds=compute,
        other_seconds=other,
        gradient_bytes=grads,
        samples_per_rank=one["batch_size_per_rank"],
        bucket_bytes=bucket,
        intra=Link(alpha, bus),
        gpus_per_node=1 << 30,  # all on this node
        cores=cores,
        threads_per_rank=threads,
    )
    at_k = model.predict(base, k)
    pipelined = at_k["exposed_communication_seconds"]
    measured_exposed = (many.get("breakdown") or {}).get("exposed_communication_seconds", 0.0)
    room = at_k["communication_seconds"] - pipelined
    overlap = 1.0 if room <= 1e-9 else min(1.0, max(0.0, 1 - (measured_exposed - pipelined) / room))
    # What the K-rank step took beyond the model's parts: DDP's own cost (hooks, copies, launches) and this run's
    # noise, carried to every larger N; so the model reproduces the step it was measured on.
    wrapper = max(0.0, many["step_seconds"] - model.predict(replace(base, overlap=overlap), k)["step_seconds"])
    assumptions = (
        Assumption("compute (forward + backward) per rank", compute * 1e3, "ms", f"{here}, per core share"),
        Assumption("optimizer and the rest of a step", other * 1e3, "ms", f"{here}, per core share"),
        Assumption("gradient bytes", grads / model.MIB, "MiB", "counted here (the model's parameters)"),
        Assumption("bucket cap", bucket / model.MIB, "MiB", "the config's dist.bucket_cap_mb"),
        Assumption("latency per ring step", alpha * 1e6, "us", f"{here}: 4-byte all-reduce / 2(n-1)"),
        Assumption("bus bandwidth", bus / 1e9, "GB/s", f"{here}: all-reduce of the gradients' bytes"),
        Assumption("overlap of communication with backward", overlap, "", f"{here}: exposed vs pipelined"),
        Assumption("DDP's own cost a step", wrapper * 1e3, "ms", f"{here}: the step less the model's parts"),
        Assumption("backward share of compute", model.BACKWARD_SHARE, "", "assumed: backward ~ 2x forward"),
        *(
            (Assumption("processors for the ranks", cores, "cores", "this machine"),)
            if cores is not None
            else (Assumption("processors for the ranks", 1, "device per rank", "this machine"),)
        ),
    )
    return replace(base, overlap=overlap, wrapper_seconds=wrapper, assumptions=assumptions)


def compare(inputs: model.Inputs, measured: list[dict[str, Any]], from_ranks: int) -> list[dict[str, Any]]:
    """Predicted beside measured for every world size; `error` where N was not an input."""
    rows = []
    for m in measured:
        n = m["world_size"]
        p = model.predict(inputs, n)
        rows.append(
            {
                "world_size": n,
                "input": n <= from_ranks,
                "predicted_step_seconds": p["step_seconds"],
                "measured_step_seconds": m["step_seconds"],
                "predicted_samples_per_second": p["samples_per_second"],
                "measured_samples_per_second": m["samples_per_second"],
                "predicted_exposed_communication_seconds": p["exposed_communication_seconds"],
                "error": abs(p["step_seconds"] - m["step_seconds"]) / m["step_seconds"],
            }
        )
    return rows


def project(
    inputs: model.Inputs, platform_key: str, calibration: rows_table.Calibration | None = None
) -> list[dict[str, Any]]:
    """This step at 8, 64 and 512 GPUs on a platform's nodes (its node busbw and its NICs), per strategy; or, with a
    calibration, on the nodes a `lab validate` run measured (its node's and all nodes' all-reduce bus bandwidth)."""
    from lab.measure import platforms

    if calibration is not None:
        node = calibration.node_gbytes * 1e9
        across = (calibration.nodes_gbytes or calibration.node_gbytes) * 1e9
        on = replace(
            inputs,
            intra=Link(model.ASSUMED_INTRA_LATENCY_SECONDS, node),
            inter=Link(model.ASSUMED_INTER_LATENCY_SECONDS, across),
            gpus_per_node=calibration.ranks_per_node,
            cores=None,
        )
    else:
        platform = platforms.BY_KEY[platform_key]
        assert platform.node_healthy_gbps is not None and platform.ib is not None and platform.gpu_count
        count, rate, _ = platform.ib
        on = replace(
            inputs,
            intra=Link(model.ASSUMED_INTRA_LATENCY_SECONDS, platform.node_healthy_gbps * 1e9),
            inter=Link(model.ASSUMED_INTER_LATENCY_SECONDS, platforms.NIC_EFFICIENCY * count * rate / 8 * 1e9),
            gpus_per_node=platform.gpu_count,
            cores=None,
        )
    return [
        model.predict(model.with_strategy(on, strategy), n)
        for n in scaling_laws.PROJECT_AT
        for strategy in ("ddp", "zero2", "fsdp")
    ]


def render(
    rows: list[dict[str, Any]],
    inputs: model.Inputs,
    projected: list[dict[str, Any]],
    context: str,
    calibration: rows_table.Calibration | None = None,
) -> str:
    lines = [
        f"Predicted from 1..{max(r['world_size'] for r in rows if r['input'])} ranks, then measured: {context}.",
        "",
    ]
    lines += ["Assumptions:", *(f"  {a.line()}" for a in inputs.assumptions), ""]
    lines += [
        "| ranks | predicted step | measured step | error | predicted images/s | measured images/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        error = f"{r['error']:.1%}" + (" (input)" if r["input"] else "")
        lines.append(
            f"| {r['world_size']} | {r['predicted_step_seconds'] * 1e3:.1f} ms | "
            f"{r['measured_step_seconds'] * 1e3:.1f} ms"
            f" | {error} | {r['predicted_samples_per_second']:.1f} | {r['measured_samples_per_second']:.1f} |"
        )
    if projected:
        where = (
            f"node and all nodes' bus bandwidth measured by `lab validate` ({calibration.source}: "
            f"{calibration.node_gbytes:g} and {calibration.nodes_gbytes or calibration.node_gbytes:g} GB/s, "
            f"{calibration.ranks_per_node} rank(s) a node)"
            if calibration
            else "node and NIC bus bandwidth from a platform table (lab.measure.platforms)"
        )
        lines += [
            "",
            f"This step projected past this machine (weak scaling): {where}, latency per ring step assumed "
            f"{model.ASSUMED_INTRA_LATENCY_SECONDS * 1e6:g} us in a node, "
            f"{model.ASSUMED_INTER_LATENCY_SECONDS * 1e6:g} us between nodes:",
            "",
        ]
        lines += [
            "| GPUs | nodes | strategy | step | exposed communication | efficiency |",
            "|---:|---:|---|---:|---:|---:|",
        ]
        for p in projected:
            lines.append(
                f"| {p['world_size']} | {p['nodes']} | {p['strategy']} | {p['step_seconds'] * 1e3:.1f} ms | "
                f"{p['exposed_communication_seconds'] * 1e3:.2f} ms | {p['efficiency']:.1%} |"
            )
    return "\n".join(lines)


def world(gpus: int, check_up_to: int | None, measure_up_to: int) -> tuple[int, int, bool]:
    """(GPUs used, the largest world, whether the GPUs are hidden): one rank a GPU, so a prediction checked on
    GPUs needs a GPU for each rank up to --check-up-to. A host with fewer GPUs than a bare `lab predict` checks on
    (measure_up_to + 1) predicts on CPU processes instead, saying so; --check-up-to past the GPUs is refused.

    >>> world(8, None, 2), world(2, None, 2), world(1, None, 2), world(0, None, 2), world(0, 6, 2)
    ((8, 8, False), (0, 4, True), (0, 4, True), (0, 4, False), (0, 6, False))
    """
    if check_up_to is not None and check_up_to <= measure_up_to:
        raise LabError(
            f"--check-up-to {check_up_to}: must be above --measure-up-to {measure_up_to} "
            "(the ranks to predict and measure)"
        )
    if gpus and check_up_to is not None and check_up_to > gpus:
        raise LabError(
            f"--check-up-to {check_up_to}: this host has {gpus} GPU(s), one a rank; use at most "
            f"--check-up-to {gpus}, or predict on CPU processes: CUDA_VISIBLE_DEVICES= lab predict"
        )
    if gpus > measure_up_to:
        return gpus, check_up_to or gpus, False
    return 0, check_up_to or 4, gpus > 0


def run(args: argparse.Namespace) -> int:
    from lab import plots
    from lab.measure.bench.train import scaling
    from lab.run import config
    from lab.run.cluster import cores, runner
    from lab.run.training import runs

    if args.plot:
        plots.require()
    present = cores.gpu_count()
    gpus, largest, hide_gpus = world(present, args.check_up_to, args.measure_up_to)
    if hide_gpus:
        print(
            f"lab predict: this host has {present} GPU(s), too few to measure 1..{args.measure_up_to} and check a "
            f"larger world on GPUs (a rank a GPU): measured and checked on CPU processes over gloo instead",
            flush=True,
        )
    runner.check_processes(largest, f"--check-up-to {largest}")
    cfg = config.load(args.config or ("workshop-gpu" if gpus else "smoke"), list(args.overrides))
    batch = args.batch_per_rank or (256 if gpus else 32)
    sizes = list(range(1, largest + 1))
    for n in sizes:
        config.check_layout(config.with_overrides(cfg, train={"global_batch_size": batch * n}), n)
    threads = cores.threads_per_process(largest)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **({"CUDA_VISIBLE_DEVICES": ""} if hide_gpus else {})}
    results = scaling.measure(sizes, cfg, env, args.steps, args.warmup, lambda n: batch * n, "predict")
    if results is None:
        return 1
    measured = scaling.derive(results)
    on_cpu = results[0]["device"] == "cpu"
    inputs = inputs_from(measured[0], measured[args.measure_up_to - 1], cores.available() if on_cpu else None, threads)
    rows = compare(inputs, measured, args.measure_up_to)
    calibration = rows_table.Calibration.read(args.calibration) if args.calibration else None
    projected = project(inputs, args.platform, calibration)
    context = f"{results[0]['data']}, ResNet-18 width {cfg.model.width}, {results[0]['device']}, batch {batch} a rank"
    if on_cpu:
        context += f", {threads} thread(s) a rank on {cores.available()} cores"
    print(render(rows, inputs, projected, context, calibration), flush=True)
    result = {
        "benchmark": "predict",
        "context": context,
        "measure_up_to": args.measure_up_to,
        "rows": rows,
        "measured": measured,
        "assumptions": [a.__dict__ for a in inputs.assumptions],
        "projection": {
            "platform": None if calibration else args.platform,
            "calibration": calibration.source if calibration else None,
            "rows": projected,
        },
    }
    if args.json:
        runs.write_json(args.json, result)
    if args.plot:
        plots.prediction(rows, context, Path(args.plot))
        print(f"plot: {args.plot}", flush=True)
    return 0
