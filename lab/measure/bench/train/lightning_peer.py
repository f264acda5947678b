"""The lab against a peer: the same ResNet-18 trained by `lab train` and by PyTorch Lightning's Trainer.

    lab bench lightning --config workshop-cpu --steps 50 --nproc-per-node 2 --json lightning.json
    lab bench lightning --config workshop-gpu --set train.amp=bf16 --steps 200 --json lightning.json

Both sides run under torchrun from the lab's one command builder, with the same threads per process, in the
same invocation: the lab as its users run it (`lab train`, run directory, log rows, evaluation at the end),
Lightning as a Lightning user would (a LightningModule, `Trainer.fit`, no logger, checkpoint or progress bar,
like the lab side's `checkpoint.save=false`). What they share, so the ratio compares the trainers:
- the model (lab.run.training.model.build of the config's model section) and its initialisation seed;
- the data: the config's synthetic data set, fed to both through the lab's device loader (same shards, order
  and augmentation; `lab bench pipeline` compares data paths, this does not);
- the optimizer and schedule (lab.run.training.optim: SGD with the config's lr, momentum, Nesterov, weight decay);
- precision: the lab's train.amp resolved once (bf16 on a GPU with --set train.amp=bf16 is Lightning's
  "bf16-mixed"), cuDNN autotuning as the lab sets it, SyncBatchNorm and torch.compile as configured;
- DDP's settings (bucket size, gradients as bucket views, static graph, buffer sync): the lab's, given to
  Lightning's DDPStrategy (--lightning-ddp default leaves Lightning's own).
Steady state: the first `--warmup` steps are left out on both sides (the lab logs every `--warmup` steps and
its first log interval is dropped; Lightning's clock starts after the device finished step `--warmup`), so
images/s = global batch x (steps - warmup) / seconds on both. The ratio printed is lab / Lightning.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lab.errors import EXIT_FAILED, EXIT_OK, LabError

if TYPE_CHECKING:  # imported where used: `lab bench --help` must not wait for torch
    from lab.run.config import Config

LIGHTNING_VERSION = "2.6.6"  # the GPU machines' release, pinned in constraints.txt
DEFAULT_WARMUP = 5


@dataclass(frozen=True)
class Peer:
    """One comparison's settings, checked before anything starts."""

    config: str
    overrides: tuple[str, ...]  # the user's --set items, then the benchmark's (later wins)
    steps: int
    warmup: int
    nproc: int
    global_batch: int
    lightning_ddp: str  # "lab": the lab's DDP settings; "default": Lightning's own

    @property
    def timed_steps(self) -> int:
        return self.steps - self.warmup


def bench_overrides(steps: int, warmup: int, global_batch: int, output_dir: str) -> list[str]:
    """What both sides train on: `steps` steps of generated data, one epoch, nothing written but the records.

    >>> bench_overrides(50, 5, 128, "/tmp/x")[:3]
    ['data.source=synthetic', 'data.synthetic_train_size=6400', 'data.synthetic_test_size=64']
    """
    return [
        "data.source=synthetic",
        f"data.synthetic_train_size={global_batch * steps}",
        "data.synthetic_test_size=64",
        "train.epochs=1",
        f"train.max_steps={steps}",
        "train.stop_after_steps=0",
        "train.grad_accum_steps=1",
        f"train.log_every={warmup}",
        "train.profile_steps=0",
        "checkpoint.save=false",
        "checkpoint.every_steps=0",
        "checkpoint.resume=never",
        f"run.output_dir={output_dir}",
        "metrics.port_base=0",
    ]


def default_warmup(steps: int) -> int:
    """5 steps, or half of a short run (at least one step is left to time).

    >>> default_warmup(50), default_warmup(4), default_warmup(2)
    (5, 2, 1)
    """
    return max(1, min(DEFAULT_WARMUP, steps // 2))


def require_lightning() -> None:
    """Refuse in one line when Lightning is missing; found without importing it (that costs seconds)."""
    if importlib.util.find_spec("lightning") is None:
        raise LabError(
            f"lab bench lightning needs the Python package lightning, which is not installed: "
            f"pip install lightning=={LIGHTNING_VERSION}"
        )


def prepare(args: argparse.Namespace) -> Peer:
    """The comparison `args` asks for, or a LabError naming what is wrong."""
    from lab.run import config
    from lab.run.cluster import torchrun_env

    if torchrun_env.launched_by_torchrun():
        raise LabError(
            "lab bench lightning: already running under torchrun; run it without torchrun "
            "(it starts torchrun itself, --nproc-per-node N)"
        )
    warmup = default_warmup(args.steps) if args.warmup is None else args.warmup
    if warmup >= args.steps:
        raise LabError(
            f"--warmup {warmup}: leaves none of --steps {args.steps} to time; use fewer warm-up steps than --steps"
        )
    name = args.config or "smoke"
    cfg = config.load(name, args.overrides)
    if cfg.dist.strategy != "ddp":
        raise LabError(
            f"{cfg.origin}: dist.strategy: {cfg.dist.strategy} is not compared with Lightning; "
            f"lab bench lightning compares DDP (dist.strategy=ddp)"
        )
    config.check_layout(config.with_overrides(cfg, train={"grad_accum_steps": 1}), args.nproc_per_node)
    _check_devices(cfg, args.nproc_per_node)
    return Peer(
        name,
        tuple(args.overrides),
        args.steps,
        warmup,
        args.nproc_per_node,
        cfg.train.global_batch_size,
        args.lightning_ddp,
    )


def _check_devices(cfg: Config, nproc: int) -> None:
    """More processes than GPUs would fail in every worker; say it once, before anything starts."""
    import torch

    if cfg.dist.device != "cpu" and torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise LabError(
            f"--nproc-per-node {nproc}: this node has {torch.cuda.device_count()} GPU(s); use at most "
            f"that many, or --set dist.device=cpu"
        )


# ----------------------------------------------------------------------------- the parent


def run(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import harness
    from lab.run.training import runs

    require_lightning()
    peer = prepare(args)
    blocks: dict[str, list[dict[str, Any]]] = {"lab": [], "lightning": []}
    with tempfile.TemporaryDirectory(prefix="lab-lightning-") as tmp:
        for index, lab_turn in enumerate(harness.abba(args.rounds)):
            folder = Path(tmp) / str(index)
            block = _run_lab(peer, folder) if lab_turn else _run_lightning(peer, folder)
            if block is None:
                print(
                    f"lab bench lightning: the {'lab' if lab_turn else 'Lightning'} run failed (its log is above)",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_FAILED
            blocks["lab" if lab_turn else "lightning"].append(block)
    result = summarize(peer, blocks["lab"], blocks["lightning"])
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    return EXIT_OK


def _torchrun(peer: Peer, target: list[str]) -> int:
    """Both sides start through the lab's one torchrun builder and runner: the same threads per process."""
    from lab.run.cluster import launch

    return launch.run(launch.torchrun_command(peer.nproc, target), peer.nproc)


def _run_lab(peer: Peer, folder: Path) -> dict[str, Any] | None:
    """`lab train` as a user starts it with --nproc-per-node; its log rows give the steady-state images/s."""
    from lab.run import config
    from lab.run.training import runs

    run_id = runs.new_run_id("lightning-peer")
    overrides = [
        *peer.overrides,
        *bench_overrides(peer.steps, peer.warmup, peer.global_batch, str(folder)),
        f"run.id={run_id}",
    ]
    # as `lab train --nproc-per-node` starts it: the config checked here, the workers handed the resolved file
    if _torchrun(peer, runs.resolved_target(config.load(peer.config, overrides), peer.nproc).target) != 0:
        return None
    run_path = folder / run_id
    return {
        **lab_steady_state(runs.read_metrics(run_path), peer.warmup, peer.global_batch),
        "run_id": run_id,
        "amp": runs.read_json(run_path / "manifest.json").get("amp"),
    }


def lab_steady_state(rows: list[dict[str, Any]], warmup: int, global_batch: int) -> dict[str, Any]:
    """images/s over the log rows after the first `warmup` steps, and the mean loss of both parts.

    >>> rows = [{"step": 2, "loss": 2.3, "step_time_seconds": 1.0}, {"step": 4, "loss": 2.1, "step_time_seconds": 0.5},
    ...         {"step": 5, "loss": 2.0, "step_time_seconds": 0.5}]
    >>> r = lab_steady_state(rows, 2, 100)
    >>> r["images_per_second"], r["seconds"], r["warmup_loss"], round(r["timed_loss"], 4)
    (200.0, 1.5, 2.3, 2.0667)
    """
    timed, seconds, loss, before = 0, 0.0, 0.0, 0
    warm = [r["loss"] for r in rows if r["step"] <= warmup]
    for row in rows:
        steps, before = row["step"] - before, row["step"]
        if row["step"] > warmup:
            timed += steps
            seconds += steps * row["step_time_seconds"]
            loss += steps * row["loss"]
    if not timed or not warm:
        raise LabError(f"lab train logged no row after step {warmup}: its steady state cannot be measured")
    return {
        "images_per_second": global_batch * timed / seconds,
        "seconds": seconds,
        "warmup_loss": warm[-1],
        "timed_loss": loss / timed,
    }


def _run_lightning(peer: Peer, folder: Path) -> dict[str, Any] | None:
    """This module as a job of N ranks: Lightning's Trainer on the same settings; rank 0 reports the result."""
    from lab.run import config
    from lab.run.cluster import jobs

    overrides = [*peer.overrides, *bench_overrides(peer.steps, peer.warmup, peer.global_batch, str(folder))]
    job = jobs.Job(
        "lab.measure.bench.train.lightning_trainer",
        peer.nproc,
        config=config.load(peer.config, overrides),
        params={"steps": peer.steps, "warmup": peer.warmup, "lightning_ddp": peer.lightning_ddp},
        reports=1,
    )
    try:
        return jobs.run(job)[0]
    except jobs.JobFailed as exc:
        print(exc.tail(), file=sys.stderr, flush=True)
        return None


def summarize(peer: Peer, lab: list[dict[str, Any]], lightning: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON result: the median block of each side (one block each unless --rounds), the ratio, the settings.

    >>> peer = Peer("smoke", (), 4, 2, 1, 64, "lab")
    >>> r = summarize(peer, [{"images_per_second": 90.0}], [{"images_per_second": 100.0, "precision": "32-true"}])
    >>> r["ratio_lab_over_lightning"], r["timed_steps"], r["precision"]
    (0.9, 2, '32-true')
    """
    lab_ips = statistics.median(b["images_per_second"] for b in lab)
    lightning_ips = statistics.median(b["images_per_second"] for b in lightning)
    first = lightning[0]
    return {
        "benchmark": "lightning",
        "config": peer.config,
        "overrides": list(peer.overrides),
        "steps": peer.steps,
        "warmup_steps": peer.warmup,
        "timed_steps": peer.timed_steps,
        "global_batch_size": peer.global_batch,
        "nproc_per_node": peer.nproc,
        "world_size": first.get("world_size", peer.nproc),
        "batch_size_per_rank": first.get("batch_size_per_rank"),
        "rounds": len(lab),
        "precision": first.get("precision"),
        "lab_amp": lab[0].get("amp"),
        "device": first.get("device"),
        "threads_per_process": first.get("threads"),
        "model": first.get("model"),
        "optimizer": first.get("optimizer"),
        "data": first.get("data"),
        "lightning_ddp": peer.lightning_ddp,
        "lightning_strategy": first.get("strategy"),
        "lightning_version": first.get("lightning_version"),
        "torch_version": first.get("torch_version"),
        "lab_images_per_second": lab_ips,
        "lightning_images_per_second": lightning_ips,
        "ratio_lab_over_lightning": lab_ips / lightning_ips,
        "lab_blocks": lab,
        "lightning_blocks": lightning,
    }


def render(r: dict[str, Any]) -> str:
    lines = [
        f"ResNet-18 width {(r['model'] or {}).get('width')}, {r['data']}, global batch {r['global_batch_size']} "
        f"on {r['world_size']} process(es) x {r['threads_per_process']} thread(s), {r['device']}, "
        f"precision {r['precision']} (lab amp {r['lab_amp']}); {r['steps']} steps, the first "
        f"{r['warmup_steps']} left out of the timing on both sides.",
        "",
        "| trainer | images/s | warm-up loss | timed loss |",
        "|---|---:|---:|---:|",
    ]
    for label, key in (
        ("lab (lab train)", "lab_blocks"),
        (f"Lightning {r['lightning_version']} Trainer ({r['lightning_strategy']})", "lightning_blocks"),
    ):
        lines += [
            f"| {label} | {b['images_per_second']:.1f} | {b['warmup_loss']:.4f} | {b['timed_loss']:.4f} |"
            for b in r[key]
        ]
    lines += [
        "",
        f"lab / Lightning images/s: {r['ratio_lab_over_lightning']:.3f}"
        + (f" (medians of {r['rounds']} rounds, ABBA order)" if r["rounds"] > 1 else ""),
    ]
    return "\n".join(lines)
