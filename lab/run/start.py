"""How a run starts: `lab train` (alone, or torchrun with N workers of it) and `lab launch` (one node's torchrun,
from the lab's builder, for any target). Each checks the whole request here, once, before a process starts: a
refusal is one line and exit 2, and leaves no run directory.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from lab.errors import EXIT_FAILED, EXIT_OK, LabError

if TYPE_CHECKING:  # types only: each command imports the config where it loads one
    from lab.run.config import Config


def train(args: argparse.Namespace) -> int:
    from lab.run import config

    if args.help_config:
        print(config.describe())
        return EXIT_OK
    if args.resolved:  # a worker of `lab train --nproc-per-node` or `lab launch`: its parent loaded and checked
        from lab.run.training import runs

        return _train_here(*runs.read_resolved(args.resolved))
    _refuse_foreign_launch()
    if args.profile:
        args.overrides = ["train.profile_steps=5", *args.overrides]
    cfg = config.load(args.config, args.overrides)
    if cfg.dist.strategy == "horovod":
        from lab.run.cluster import horovodrun

        horovodrun.check_installed()
        horovodrun.check_worker()
    if args.nproc_per_node is not None:
        return _launch_train(args, cfg)
    from lab.run.cluster import torchrun_env

    world_size = torchrun_env.layout().world_size  # this process's world: 1 alone, torchrun's or horovodrun's
    check_training(cfg, world_size)  # every check before the run directory exists: a refusal leaves no trace
    return _train_here(cfg, world_size)


def _train_here(cfg: Config, checked_world_size: int | None) -> int:
    """This process's rank of the run (the whole baseline when alone)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from lab.run.training import lifecycle as training

    # record: torchrun reports a failed rank's traceback, not just its exit code
    record(training.run)(cfg, checked_world_size=checked_world_size)
    return EXIT_OK


def _launch_train(args: argparse.Namespace, cfg: Config) -> int:
    """torchrun (or horovodrun) with N workers of this run: the config checked here, once, for N ranks, the run
    id decided here (so a restarted worker group finds its checkpoint), both handed to the workers in the run's
    config.json (lab.run.training.runs.write_resolved): no worker parses or checks the command line again."""
    from lab.run.cluster import launch
    from lab.run.training import runs

    launch.check_not_nested()
    check_training(cfg, args.nproc_per_node)
    target, run_dir, _ = runs.resolved_target(cfg, args.nproc_per_node)
    if cfg.dist.strategy == "horovod":
        from lab.run.cluster.horovodrun import horovodrun_command

        command = horovodrun_command(args.nproc_per_node, target, timeout_seconds=cfg.dist.timeout_seconds)
    else:
        command = launch.torchrun_command(args.nproc_per_node, target)
    try:
        # the ranks' watchdogs write into the run directory: hang/rank-N.json, and hang.json when one stalls
        status = launch.run(command, args.nproc_per_node, hang_folder=run_dir.path if run_dir is not None else None)
    finally:  # workers that refused (or died) before the run's first start leave no run directory behind
        if run_dir is not None:
            run_dir.remove_if_unstarted()
    return EXIT_OK if status == 0 else EXIT_FAILED


def check_training(cfg: Config, world_size: int | None) -> None:
    """Refuse here what every worker would refuse: one line and exit 2 instead of torchrun's failure report. Torch is
    imported only to read a checkpoint named by path: a launcher's front process starts its workers without it."""
    from lab.run import config, data
    from lab.run.training import plan

    if world_size is not None:
        config.check_layout(cfg, world_size)
    if cfg.checkpoint.resume not in ("auto", "never"):
        from lab.run.training import checkpoint

        checkpoint.check_resumable(cfg.checkpoint.resume)
    data.check_source(cfg.data)
    known = data.generated_train_size(cfg.data)
    if world_size is not None and known is not None:
        plan.plan_steps(cfg, world_size, known)  # a global batch larger than a rank's share is refused here


# ----------------------------------------------------------------------------- launching


def launch(args: argparse.Namespace) -> int:
    from lab.run.cluster import launch as launching
    from lab.run.cluster import watched
    from lab.run.training import runs

    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        raise LabError("nothing to run; end with `-- -m lab train --config ddp` or `-- SCRIPT.py ARGS`")
    launching.check_not_nested()
    # under Slurm the first node serves the store: its address is the endpoint (lab.run.cluster.slurm.placement)
    store_host = _place_from_slurm(args) if args.slurm else None
    rdzv = launching.Rendezvous(
        endpoint=args.rdzv_endpoint,
        nnodes=args.nnodes,
        run_id=args.rdzv_id,
        max_restarts=args.max_restarts,
        local_addr=args.local_addr,
        join_timeout=args.join_timeout,
        store_host=store_host,
    )
    rdzv.check()
    if rdzv.endpoint is None:  # one node: a Slurm step of several tasks would start several independent jobs
        _refuse_foreign_launch()
    fixed_nodes = rdzv.nnodes.isdigit()  # an elastic job's world size is known only at the rendezvous
    world_size = args.nproc_per_node * int(rdzv.nnodes) if fixed_nodes else None
    cfg = _check_lab_train_target(target, world_size, args.parser)
    if not watched.is_lab(target) and args.hang_seconds > 0:  # anyone's script: watched from outside it
        target = watched.wrap(target, args.hang_seconds, args.stop_seconds)
    if args.dry_run:
        print(shlex.join(launching.torchrun_command(args.nproc_per_node, target, rdzv)))
        return EXIT_OK
    run_dir = None
    with tempfile.TemporaryDirectory(prefix="lab-launch-") as folder:
        # One node, or every node told the job's rendezvous id: the run id is known here, and the workers get the
        # checked config in a file of this launch's (gone when they end). Nodes without a shared id leave the id
        # to their rank 0, and their workers check the config again.
        if cfg is not None and (rdzv.endpoint is None or rdzv.run_id or cfg.run.id):
            handoff = runs.resolved_target(cfg, world_size, rdzv.run_id, Path(folder))
            print(
                f"lab launch: {shlex.join(target)}: checked here for {world_size or 'the rendezvous'} rank(s), run "
                f"{handoff.run_id}; the workers read it from {handoff.target[-1]}",
                file=sys.stderr,
                flush=True,
            )
            target = handoff.target
            run_dir = Path(cfg.run.output_dir) / handoff.run_id  # where the workers' RunDir will be
        command = launching.torchrun_command(args.nproc_per_node, target, rdzv)
        # a lab train run's watchdogs write into its run directory (hang.json), any other target's into a folder
        # of the launch's own, kept only when it holds a diagnosis
        status = launching.run(command, args.nproc_per_node, rdzv, hang_folder=run_dir)
        return EXIT_OK if status == 0 else EXIT_FAILED


def _place_from_slurm(args: argparse.Namespace) -> bool:
    """`lab launch --slurm`: the rendezvous from the allocation (lab.run.cluster.slurm), said on one line; whether
    this node is the first, whose torchrun serves the rendezvous store."""
    import sys

    from lab.run.cluster import slurm

    given = [
        name
        for name, value in (
            ("--nnodes", args.nnodes != "1"),
            ("--rdzv-endpoint", args.rdzv_endpoint),
            ("--local-addr", args.local_addr),
        )
        if value
    ]
    if given:
        raise LabError(f"--slurm takes {', '.join(given)} from the allocation; drop {' and '.join(given)}")
    place = slurm.placement(args.rdzv_port)
    args.nnodes, args.rdzv_endpoint, args.local_addr = str(place.nnodes), place.endpoint, place.local_addr
    args.rdzv_id = args.rdzv_id or place.run_id
    job = slurm.allocation()
    assert job is not None  # placement() refused already outside a Slurm job
    print(
        f"lab launch: Slurm job {job.job_id}, node {job.node_id} of {place.nnodes} ({job.node_name}, "
        f"{place.local_addr}); rendezvous '{args.rdzv_id}' at {place.endpoint}",
        file=sys.stderr,
        flush=True,
    )
    return job.node_id == 0


def _refuse_foreign_launch() -> None:
    """Several processes that Slurm or MPI started, each about to run alone: one line, exit 2."""
    from lab.run.cluster import slurm

    reason = slurm.foreign_launch()
    if reason:
        raise LabError(reason)


def _check_lab_train_target(
    target: list[str], world_size: int | None, parser: argparse.ArgumentParser
) -> Config | None:
    """When the workers will run `-m lab train ...`, load its config now (a bad --set is exit 2 here) and return
    it, checked for `world_size` ranks; None for any other target. `parser` is the command line's own (lab.cli
    passes it in the Namespace: this module never imports lab.cli)."""
    if target[:3] != ["-m", "lab", "train"]:
        return None
    from lab.run import config

    args = parser.parse_args(target[2:])
    if args.help_config or args.resolved or args.nproc_per_node is not None:
        return None  # the workers print the keys, read a parent's file, or refuse to nest torchrun themselves
    if args.profile:
        args.overrides = ["train.profile_steps=5", *args.overrides]
    cfg = config.load(args.config, args.overrides)
    if cfg.dist.strategy == "horovod":  # lab launch starts torchrun, whose workers would each be a world of one
        from lab.run.cluster.horovodrun import NOT_UNDER_TORCHRUN

        raise LabError(NOT_UNDER_TORCHRUN)
    check_training(cfg, world_size)
    return cfg
