"""`lab train`: one whole run around the Trainer (lab.run.training.trainer), on one rank.

    lab train --config baseline                                   # 1 process: the baseline
    torchrun --standalone --nproc-per-node 2 -m lab train --config ddp
    lab train --config ddp --nproc-per-node 2                     # the same; prints its torchrun line
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HEAD:29400 --rdzv-id RUN -m lab train --config ddp   # on each of two nodes

A run's life: open the run directory and find the state to resume from, build the
trainer, attach the observers (console, metrics file, exporter), record the start,
fit, record the end. What a run is, beside how it trains.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from lab.errors import CheckpointError, LabError
from lab.formatting import num, pct
from lab.run import data
from lab.run.cluster import dist, provenance, seat, slurm, torchrun_env
from lab.run.config import Config, check_layout, to_dict
from lab.run.observability import device_memory, metrics
from lab.run.training import checkpoint, stragglers
from lab.run.training.console import Console, SilentConsole
from lab.run.training.runs import RunDir, git_revision, run_id_for
from lab.run.training.trainer import Hook, Trainer, set_determinism


class Recovery(NamedTuple):
    """How this start of the run came about: torchrun restarts so far and the steps they made it redo."""

    restarts: int  # TORCHELASTIC_RESTART_COUNT: 0 on the first start
    steps_redone: int  # steps logged by the attempt that died after the checkpoint this start resumed from
    redone_before: int  # the same, summed over earlier restarts

    @property
    def steps_redone_total(self) -> int:
        return self.steps_redone + self.redone_before


@dataclass
class RunStart:
    """One start of a run as each step of its life sees it (instead of long positional argument lists)."""

    cfg: Config
    ctx: dist.DistContext
    run_dir: RunDir
    dataset: data.Dataset
    console: Console
    trainer: Trainer
    recovery: Recovery
    resume_path: str | None
    versions: dict[str, str | None]  # read once: the exporter's info and the manifest say the same
    wall_start: float

    def manifest(self, ranks: list[dict]) -> dict[str, Any]:
        cfg, ctx, trainer, dataset = self.cfg, self.ctx, self.trainer, self.dataset
        start = {
            "time": time.time(),
            "step": trainer.step,
            "world_size": ctx.world_size,
            "restart_count": self.recovery.restarts,
            "resumed_from": self.resume_path,
            "steps_redone": self.recovery.steps_redone,
        }
        return {
            "run_id": self.run_dir.run_id,
            "config": to_dict(cfg),
            "config_origin": cfg.origin,
            "seed": cfg.run.seed,
            "data": {
                "source": dataset.source,
                "description": dataset.description,
                "train_size": len(dataset.train_labels),
                "test_size": len(dataset.test_labels),
            },
            "world_size": ctx.world_size,
            "backend": ctx.backend,
            **trainer.strategy.describe(),
            "batch_size_per_rank": trainer.batch_size,
            "steps_per_epoch": trainer.steps_per_epoch,
            "total_steps": trainer.total_steps,
            "amp": _amp_name(trainer),
            "versions": self.versions,
            "git_revision": git_revision(),
            "hosts": sorted({r["host"] for r in ranks}),
            "ranks": ranks,
            "environment": provenance.recorded_env(),
            "starts": [start],
            "slurm": slurm.record(),
            "seat": seat.seat(),  # a workshop room's seat, else None
        }

    def summary(self, results: dict[str, Any], status: str, error: str | None = None) -> dict[str, Any]:
        summary = {
            "run_id": self.run_dir.run_id,
            "status": status,
            "data_source": self.dataset.source,
            "world_size": self.ctx.world_size,
            **self.trainer.strategy.describe(),
            "global_batch_size": self.cfg.train.global_batch_size,
            "wall_time_seconds": time.time() - self.wall_start,
            "restart_count": self.recovery.restarts,
            "steps_redone": self.recovery.steps_redone_total,
            "host": socket.gethostname(),
            **results,
        }
        if error:
            summary["error"] = error
        return summary

    def announce(self) -> None:
        ctx, t, trainer = self.ctx, self.cfg.train, self.trainer
        device = f"{ctx.world_size} x {ctx.device.type}" + (f" ({ctx.backend})" if ctx.backend else "")
        self.console.say(
            f"run {self.run_dir.run_id}: {device}, {trainer.strategy.name}, data: {self.dataset.description}"
        )
        self.console.say(
            f"global batch {t.global_batch_size} = {ctx.world_size} rank(s) x {trainer.batch_size} "
            f"x {t.grad_accum_steps} accumulation step(s); {trainer.total_steps} steps "
            f"({trainer.steps_per_epoch} per epoch); amp {trainer.amp_dtype or 'off'}; "
            f"{torch.get_num_threads()} thread(s) per process"
        )
        if self.resume_path:
            self.console.say(f"resuming from {self.resume_path} at step {trainer.step}")


def run(cfg: Config, hooks: Iterable[Hook] = (), checked_world_size: int | None = None) -> dict[str, Any]:
    """`lab train` in this process: one rank of a torchrun job, or the whole baseline. `checked_world_size`: the
    world size the launching parent checked this config for (its resolved file), so no rank checks it again."""
    wall_start = time.time()
    with dist.initialized(cfg.dist) as ctx:
        if checked_world_size != ctx.world_size:  # torchrun typed by hand, or an elastic job: known only now
            check_layout(cfg, ctx.world_size)
        set_determinism(cfg.run.deterministic)
        r = _open(cfg, ctx, hooks, wall_start)
        with _exporter(r) as exporter:
            _record_start(r, exporter)
            results = _fit(r)
        summary = r.summary(results, status="stopped" if r.trainer.stopped else "completed")
        _record_end(r, summary)
        return summary  # dist.initialized meets at a barrier before the group goes


def _open(cfg: Config, ctx: dist.DistContext, hooks: Iterable[Hook], wall_start: float) -> RunStart:
    """The run directory, the state to resume from and the trainer; refuses bad data and too little disk
    before anything is written."""
    dataset = data.load(cfg.data).to(ctx.device)
    run_dir = RunDir(cfg.run.output_dir, resolve_run_id(cfg, ctx))
    dist.primary_then_broadcast(ctx, run_dir.create)
    if ctx.watch is not None and ctx.watch.folder is None:  # torchrun typed by hand: the run directory all the same
        ctx.watch.folder = run_dir.path
    try:
        return _start(cfg, ctx, hooks, wall_start, dataset, run_dir)
    except LabError:  # refused (a checkpoint, the disk): a directory this start made goes again
        if ctx.is_primary:
            run_dir.remove_if_unstarted()
        raise


def _start(
    cfg: Config, ctx: dist.DistContext, hooks: Iterable[Hook], wall_start: float, dataset: data.Dataset, run_dir: RunDir
) -> RunStart:
    if cfg.checkpoint.dir:  # outside the run directory: a shared file system, where rank 0's next node finds it
        folder = checkpoint.run_folder(cfg.checkpoint.dir, run_dir.run_id, run_dir.checkpoints)
        dist.primary_then_broadcast(ctx, lambda: checkpoint.prepare_folder(folder))
    last_logged, redone_before = dist.primary_then_broadcast(ctx, run_dir.progress)
    console = Console() if ctx.is_primary else SilentConsole()
    rank_hooks: list[Hook] = [run_dir.append_metrics, console, *hooks] if ctx.is_primary else list(hooks)
    trainer = Trainer(cfg, ctx, dataset, console=console, hooks=rank_hooks, run_dir=run_dir)

    # Rank 0 decides whether there is a checkpoint to resume from, so every rank takes the same branch.
    def resume_choice() -> str | None:
        own = trainer.checkpoint_path()
        assert own is not None  # the trainer has a run directory
        return find_checkpoint(cfg, own)

    resume_path = dist.primary_then_broadcast(ctx, resume_choice)
    if resume_path is not None:
        trainer.restore(resume_path)
    # Work lost to a crash: what the last start logged past the step this one resumes from (to log_every).
    recovery = Recovery(torchrun_env.restart_count(), max(0, last_logged - trainer.step), redone_before)
    dist.primary_then_broadcast(ctx, lambda: check_space(cfg, trainer, run_dir))
    return RunStart(
        cfg, ctx, run_dir, dataset, console, trainer, recovery, resume_path, provenance.versions(), wall_start
    )


@contextlib.contextmanager
def _exporter(r: RunStart) -> Iterator[metrics.NullExporter]:
    """This rank's Prometheus exporter, attached to the trainer; closed (and the run's file_sd targets
    withdrawn) however the run ends, since its ranks are gone then."""
    exporter = metrics.start(
        r.cfg.metrics, r.ctx, r.run_dir.run_id, metrics.run_info(r.ctx, r.versions, r.dataset.source), say=r.console.say
    )
    r.trainer.hooks.append(exporter)
    if r.ctx.watch is not None:  # a hang its watchdog names is a series of this rank's exporter too
        r.ctx.watch.on_diagnosis = exporter.record_hang
    try:
        yield exporter
    finally:
        exporter.close()
        if r.ctx.is_primary and r.cfg.metrics.targets_dir:
            _shared_targets(r).unlink(missing_ok=True)


def _record_start(r: RunStart, exporter: metrics.NullExporter) -> None:
    ctx = r.ctx
    if ctx.is_primary:  # a fact of the run, not of each rank: a sum over ranks must not multiply it
        exporter.record_recovery(r.recovery.restarts, r.recovery.steps_redone_total)
    ranks = dist.all_gather_object(ctx, provenance.describe(ctx))
    # Every rank has the same config, so all or none take part in this gather.
    targets = dist.all_gather_object(ctx, exporter.target()) if r.cfg.metrics.port_base else []
    if ctx.is_primary:
        r.run_dir.write_manifest(r.manifest(ranks))
        r.announce()
        _publish_targets(r, targets)
        r.console.begin(r.trainer.total_steps, r.trainer.step)


def _fit(r: RunStart) -> dict[str, Any]:
    """Train; a failure is recorded in the summary (status failed, the error) before it propagates, and a
    collective that timed out is explained by naming the ranks that stopped answering."""
    try:
        try:
            return r.trainer.fit()
        except RuntimeError as exc:
            if r.ctx.distributed and dist.is_collective_timeout(exc):
                raise dist.explain_timeout(r.ctx) from exc
            raise
    except BaseException as exc:
        if r.ctx.is_primary:
            r.run_dir.write_summary(
                r.summary(r.trainer.results(), status="failed", error=f"{type(exc).__name__}: {exc}")
            )
            if isinstance(exc, dist.CollectiveTimeout):
                # Said now, before the group goes: tearing it down ends the waiting ranks, the first rank to exit
                # makes torchrun stop this one, and its traceback (which says it again) may never be printed
                r.console.say(f"run {r.run_dir.run_id} failed: {exc}")
        raise


def _record_end(r: RunStart, summary: dict[str, Any]) -> None:
    if r.cfg.metrics.pushgateway:  # one push, rank 0's, with every rank's peak memory: run figures counted once
        _, peak = device_memory.memory_bytes(r.ctx.device)
        ranks = dist.all_gather_object(
            r.ctx, {"rank": r.ctx.global_rank, "node": socket.gethostname(), "device_memory_peak_bytes": peak}
        )
        if r.ctx.is_primary:
            metrics.push_run_summary(r.cfg.metrics, r.run_dir.run_id, summary, ranks)
    if r.ctx.is_primary:
        r.run_dir.write_summary(summary)
        r.console.say(
            f"run {r.run_dir.run_id} {summary['status']}: test accuracy {pct(summary['test_accuracy'])}, "
            f"{num(summary['samples_per_second'], '.0f')} img/s over {r.ctx.world_size} rank(s); "
            f"records in {r.run_dir.path}"
        )
        if summary.get("slowest_rank") and summary["slowest_rank"]["flagged"]:
            r.console.say(stragglers.describe(summary["slowest_rank"]))


def resolve_run_id(cfg: Config, ctx: dist.DistContext) -> str:
    """This run's id by lab.run.training.runs.run_id_for: a launching parent has set run.id already; under a torchrun
    typed by hand every rank derives it from the rendezvous id; else rank 0 decides and tells the others."""
    rendezvous = torchrun_env.rendezvous_id()
    if cfg.run.id or rendezvous:
        return run_id_for(cfg.run.name, cfg.run.id, rendezvous)
    run_id = dist.broadcast_object(ctx, run_id_for(cfg.run.name, "", None) if ctx.is_primary else None)
    assert run_id is not None  # rank 0 always names one; it replaces the other ranks' None
    return run_id


def find_checkpoint(cfg: Config, own: Path) -> str | None:
    """The checkpoint to resume from (checkpoint.resume: auto -> this run's own `own` when it exists, never,
    or a path), or None."""
    choice = cfg.checkpoint.resume
    if choice == "auto" and not os.path.exists(own):
        _refuse_another_strategys_checkpoint(cfg, own)
        return None
    if choice == "never":
        return None
    path = own if choice == "auto" else choice
    checkpoint.check_resumable(str(path))
    return str(path)


def _refuse_another_strategys_checkpoint(cfg: Config, own: Path) -> None:
    """A run id whose checkpoints/ holds another strategy's checkpoint would silently start over (and leave two
    checkpoints of one run): refuse. Temporary and staging leftovers of a crash are not checkpoints."""
    folder = own.parent
    others = (
        sorted(p.name for p in folder.iterdir() if ".tmp-" not in p.name and not p.name.endswith((".next", ".prev")))
        if folder.is_dir()
        else []
    )
    if others:
        raise CheckpointError(
            f"{folder}: holds {others[0]}, a checkpoint of another dist.strategy than "
            f"{cfg.dist.strategy} (which keeps {own.name}); resume with the strategy that wrote "
            f"it, give a new run.id, or set checkpoint.resume=never"
        )


RECORDS_BYTES = 4 * 2**20  # metrics rows, manifest, summary, report with plots


def check_space(cfg: Config, trainer: Trainer, run_dir: RunDir) -> None:
    """Room for the records in the run directory and for the checkpoints where they go (checkpoint.dir, when set,
    is another file system: each is asked for its own part)."""
    need, what = space_needed(cfg, trainer, run_dir)
    if not cfg.checkpoint.dir or not cfg.checkpoint.save:
        run_dir.check_space(need, what)
        return
    run_dir.check_space(RECORDS_BYTES, "its records")
    folder = trainer.checkpoint_folder()
    assert folder is not None  # the trainer has a run directory
    checkpoint.check_space(folder, need - RECORDS_BYTES, what.replace(", and its records", ""))


def space_needed(cfg: Config, trainer: Trainer, run_dir: RunDir) -> tuple[int, str]:
    """Bytes the run will add to its directory, and why: while a checkpoint is saved the previous one still
    exists, so the run needs room for two checkpoints, or for one when last.pt is already there."""
    records = RECORDS_BYTES
    if not cfg.checkpoint.save:
        return records, "its records"
    weights = sum(t.numel() * t.element_size() for t in trainer.model.state_dict().values())
    momentum = sum(p.numel() * p.element_size() for p in trainer.model.parameters())  # SGD: one buffer per parameter
    own = trainer.checkpoint_path()
    assert own is not None  # the trainer has a run directory
    copies = 1 if own.exists() else 2
    size = weights + momentum
    return copies * size + records, f"{copies} checkpoint(s) of {size / 2**20:.1f} MiB at a save, and its records"


def _publish_targets(r: RunStart, targets: list) -> None:
    """file_sd target files listing every rank's endpoint, so Prometheus finds the run without a config edit.
    Under Slurm each target also carries the job's id and cluster (slurm_job_id, slurm_cluster), in a workshop
    room its seat: Prometheus attaches them to every series it scrapes there, so a dashboard selects one job's
    ranks, or one seat's."""
    job = slurm.record()
    extra = {**({"slurm_job_id": job["job_id"], "slurm_cluster": job["cluster"]} if job else {}), **seat.labels()}
    if extra:
        targets = [{**t, "labels": {**t["labels"], **extra}} if t else t for t in targets]
    written = metrics.write_targets(r.run_dir.path / "prometheus-targets.json", targets)
    if written is None:
        return
    if r.cfg.metrics.targets_dir:
        metrics.write_targets(_shared_targets(r), targets)
    endpoints = ", ".join(f"http://{t['targets'][0]}/metrics" for t in targets if t)
    r.console.say(f"metrics: {endpoints} (Prometheus file_sd targets: {written})")


def _shared_targets(r: RunStart) -> Path:
    """The run's file in metrics.targets_dir, a folder every run of the host (every seat of a room) writes to."""
    return Path(r.cfg.metrics.targets_dir) / f"{seat.file_prefix()}{r.run_dir.run_id}.json"


def _amp_name(trainer: Trainer) -> str:
    return str(trainer.amp_dtype).replace("torch.", "") if trainer.amp_dtype else "off"
