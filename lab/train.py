"""`lab train`: one whole run around the Trainer (lab.trainer), on one rank.

    lab train --config baseline                                   # 1 process: the baseline
    torchrun --standalone --nproc-per-node 2 -m lab train --config ddp
    lab train --config ddp --nproc-per-node 2                     # the same; prints its torchrun line
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29400 --rdzv-id RUN -m lab train --config ddp   # on each of two nodes

The run directory and the checkpoint to resume from, the manifest, the exporter and
the summary: what a run is, beside how it trains.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from lab import checkpoint, data, dist, metrics, torchrun_env
from lab.config import Config, check_layout, to_dict
from lab.console import Console, SilentConsole
from lab.errors import CheckpointError
from lab.runs import RunDir, git_revision, new_run_id, rendezvous_run_id
from lab.trainer import Hook, Trainer, set_determinism


class Recovery(NamedTuple):
    """How this start of the run came about: torchrun restarts so far and the steps they made it redo."""

    restarts: int          # TORCHELASTIC_RESTART_COUNT: 0 on the first start
    steps_redone: int      # steps logged by the attempt that died after the checkpoint this start resumed from
    redone_before: int     # the same, summed over earlier restarts

    @property
    def steps_redone_total(self) -> int:
        return self.steps_redone + self.redone_before


def resolve_run_id(cfg: Config, ctx: dist.DistContext) -> str:
    """run.id when given; under torchrun, the name and the rendezvous id (stable across restarts, so a
    restarted group resumes its own checkpoint); else a new time-stamped id made on rank 0."""
    if cfg.run.id:
        return cfg.run.id
    rendezvous = torchrun_env.rendezvous_id()
    if rendezvous:
        return rendezvous_run_id(cfg.run.name, rendezvous)
    return dist.broadcast_object(ctx, new_run_id(cfg.run.name) if ctx.is_primary else None)


def find_resume_state(cfg: Config, run_dir: RunDir) -> tuple[dict | None, str | None]:
    """(state, path) of the checkpoint to resume from, read on rank 0, or (None, None)."""
    choice = cfg.checkpoint.resume
    if choice == "never":
        return None, None
    path = run_dir.checkpoints / checkpoint.LAST if choice == "auto" else choice
    if choice == "auto" and not os.path.exists(path):
        return None, None
    if choice != "auto" and not os.path.exists(path):
        raise CheckpointError(f"checkpoint.resume: {path} does not exist; give an existing file, auto or never")
    return checkpoint.load(path, map_location="cpu"), str(path)


def run(cfg: Config, hooks: Iterable[Hook] = ()) -> dict[str, Any]:
    """`lab train` in this process: one rank of a torchrun job, or the whole baseline."""
    wall_start = time.time()
    ctx = dist.init(cfg.dist)
    try:
        check_layout(cfg, ctx.world_size)
        set_determinism(cfg.run.deterministic)
        dataset = data.load(cfg.data).to(ctx.device)  # bad data is refused before anything is written
        run_dir = RunDir(cfg.run.output_dir, resolve_run_id(cfg, ctx))
        dist.primary_then_broadcast(ctx, run_dir.create)
        # Rank 0 reads the checkpoint and sends it to the others: nodes need no shared file system.
        resume_state, resume_path, (last_logged, redone_before) = dist.primary_then_broadcast(
            ctx, lambda: (*find_resume_state(cfg, run_dir), run_dir.progress()))
        console = Console() if ctx.is_primary else SilentConsole()
        rank_hooks = [run_dir.append_metrics, console, *hooks] if ctx.is_primary else list(hooks)
        trainer = Trainer(cfg, ctx, dataset, console=console, hooks=rank_hooks, run_dir=run_dir,
                          resume=(resume_state, resume_path) if resume_state is not None else None)
        # Work lost to a crash: what the last start had logged past the step this one resumes from
        # (to log_every granularity).
        recovery = Recovery(torchrun_env.restart_count(), max(0, last_logged - trainer.step), redone_before)
        dist.primary_then_broadcast(ctx, lambda: run_dir.check_space(*space_needed(cfg, trainer, run_dir)))
        ranks = dist.all_gather_object(ctx, dist.describe(ctx))
        versions = dist.versions()
        exporter = metrics.start(cfg.metrics, ctx, run_dir.run_id, metrics.run_info(ctx, versions, dataset.source),
                                 say=console.say)
        if ctx.is_primary:  # a fact of the run, not of each rank: a sum over ranks must not multiply it
            exporter.record_recovery(recovery.restarts, recovery.steps_redone_total)
        trainer.hooks.append(exporter)
        # Every rank has the same config, so all or none take part in this gather.
        targets = dist.all_gather_object(ctx, exporter.target()) if cfg.metrics.port_base else []
        if ctx.is_primary:
            run_dir.write_manifest(_manifest(cfg, ctx, run_dir, dataset, trainer, ranks, versions, resume_path,
                                              recovery))
            _announce(console, cfg, ctx, run_dir, dataset, trainer, resume_path)
            _publish_targets(cfg, run_dir, targets, console)
            console.begin(trainer.total_steps, trainer.step)
        try:
            try:
                results = trainer.fit()
            except RuntimeError as exc:
                if ctx.distributed and dist.is_collective_timeout(exc):
                    raise dist.explain_timeout(ctx) from exc
                raise
        except BaseException as exc:
            if ctx.is_primary:  # close, record, re-raise: the summary says how the run ended
                run_dir.write_summary(_summary(cfg, ctx, run_dir, dataset, trainer.results(), wall_start, recovery,
                                               status="failed", error=f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            exporter.close()
            if ctx.is_primary and cfg.metrics.targets_dir:  # the run's ranks are gone: stop scraping them
                (Path(cfg.metrics.targets_dir) / f"{run_dir.run_id}.json").unlink(missing_ok=True)
        summary = _summary(cfg, ctx, run_dir, dataset, results, wall_start, recovery,
                           status="stopped" if trainer.stopped else "completed")
        if cfg.metrics.pushgateway:  # each rank: its own peak memory under grouping key (job, run_id, rank)
            _, peak = dist.memory_bytes(ctx.device)
            metrics.push_run_summary(cfg.metrics, run_dir.run_id, ctx.global_rank,
                                     {**summary, "device_memory_peak_bytes": peak})
        if ctx.is_primary:
            run_dir.write_summary(summary)
            console.say(f"run {run_dir.run_id} {summary['status']}: test accuracy {_pct(summary['test_accuracy'])}, "
                        f"{_num(summary['samples_per_second'])} img/s over {ctx.world_size} rank(s); "
                        f"records in {run_dir.path}")
        dist.barrier(ctx)
        return summary
    finally:
        dist.teardown(ctx)


def space_needed(cfg: Config, trainer: Trainer, run_dir: RunDir) -> tuple[int, str]:
    """Bytes the run will add to its directory, and why: while a checkpoint is saved the previous one still
    exists, so the run needs room for two checkpoints, or for one when last.pt is already there."""
    records = 4 * 2**20  # metrics rows, manifest, summary, report with plots
    if not cfg.checkpoint.save:
        return records, "its records"
    weights = sum(t.numel() * t.element_size() for t in trainer.model.state_dict().values())
    momentum = sum(p.numel() * p.element_size() for p in trainer.model.parameters())  # SGD: one buffer per parameter
    copies = 1 if (run_dir.checkpoints / checkpoint.LAST).exists() else 2
    size = weights + momentum
    return copies * size + records, f"{copies} checkpoint(s) of {size / 2**20:.1f} MiB at a save, and its records"


def _publish_targets(cfg: Config, run_dir: RunDir, targets: list, console: Console) -> None:
    """file_sd target files listing every rank's endpoint, so Prometheus finds the run without a config edit."""
    written = metrics.write_targets(run_dir.path / "prometheus-targets.json", targets)
    if written is None:
        return
    if cfg.metrics.targets_dir:
        metrics.write_targets(Path(cfg.metrics.targets_dir) / f"{run_dir.run_id}.json", targets)
    endpoints = ", ".join(f"http://{t['targets'][0]}/metrics" for t in targets if t)
    console.say(f"metrics: {endpoints} (Prometheus file_sd targets: {written})")


def _manifest(cfg, ctx, run_dir, dataset, trainer, ranks, versions, resume_path, recovery) -> dict[str, Any]:
    start = {"time": time.time(), "step": trainer.step, "world_size": ctx.world_size,
             "restart_count": recovery.restarts, "resumed_from": resume_path, "steps_redone": recovery.steps_redone}
    return {
        "run_id": run_dir.run_id, "config": to_dict(cfg), "config_origin": cfg.origin, "seed": cfg.run.seed,
        "data": {"source": dataset.source, "description": dataset.description,
                 "train_size": len(dataset.train_labels), "test_size": len(dataset.test_labels)},
        "world_size": ctx.world_size, "backend": ctx.backend, "batch_size_per_rank": trainer.batch_size,
        "steps_per_epoch": trainer.steps_per_epoch, "total_steps": trainer.total_steps,
        "amp": str(trainer.amp_dtype).replace("torch.", "") if trainer.amp_dtype else "off",
        "versions": versions, "git_revision": git_revision(),
        "hosts": sorted({r["host"] for r in ranks}), "ranks": ranks, "environment": dist.recorded_env(),
        "starts": [start],
    }


def _summary(cfg, ctx, run_dir, dataset, results, wall_start, recovery, status, error=None) -> dict[str, Any]:
    summary = {"run_id": run_dir.run_id, "status": status, "data_source": dataset.source,
               "world_size": ctx.world_size, "global_batch_size": cfg.train.global_batch_size,
               "wall_time_seconds": time.time() - wall_start, "restart_count": recovery.restarts,
               "steps_redone": recovery.steps_redone_total,
               "host": socket.gethostname(), **results}
    if error:
        summary["error"] = error
    return summary


def _announce(console, cfg, ctx, run_dir, dataset, trainer, resume_path) -> None:
    device = f"{ctx.world_size} x {ctx.device.type}" + (f" ({ctx.backend})" if ctx.backend else "")
    console.say(f"run {run_dir.run_id}: {device}, data: {dataset.description}")
    console.say(f"global batch {cfg.train.global_batch_size} = {ctx.world_size} rank(s) x {trainer.batch_size} "
                f"x {cfg.train.grad_accum_steps} accumulation step(s); {trainer.total_steps} steps "
                f"({trainer.steps_per_epoch} per epoch); amp {trainer.amp_dtype or 'off'}; "
                f"{torch.get_num_threads()} thread(s) per process")
    if resume_path:
        console.say(f"resuming from {resume_path} at step {trainer.step}")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"
