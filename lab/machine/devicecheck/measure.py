"""What the GPU check measures on the CUDA device rather than through a `lab` command: whether the training
step syncs with the host, and how many bytes the model state holds.

    python -m lab.machine.devicecheck.measure host-syncs --config NAME [--set k=v ...] --steps 12 \\
        --variant bf16:train.amp=bf16 --variant fp16:train.amp=fp16 --json PATH
    python -m lab.machine.devicecheck.measure model-state --width 64 --json PATH

`lab.machine.devicecheck.command` runs these as child processes, like its other steps, so its deadline can stop them
(a process group is killed; a function call in the check's own process could not be) and a CUDA error in
one leaves the check itself standing. Both need a CUDA device (set_sync_debug_mode and the allocator's
counters exist only there); the check decides whether to run them and what their numbers mean.
"""

from __future__ import annotations

import argparse
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from lab.run.config import Config


def first_host_sync(cfg: Config, steps: int) -> str | None:
    """The first host sync inside `steps` training steps of `cfg` (CUDA's sync debug mode set to "error"),
    or None when there is none. The trainer's one sync per log interval comes after the guarded steps.
    With model.sync_batchnorm (and dist.single_process_group, as SyncBatchNorm needs a process group) the
    sync path of SyncBatchNorm is taken even at one rank: see sync_path_at_one_rank."""
    import torch

    from lab.run import data
    from lab.run.cluster import dist
    from lab.run.training.trainer import Trainer

    with dist.initialized(cfg.dist) as ctx:
        trainer = Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device))
        if cfg.model.sync_batchnorm and ctx.world_size == 1:
            sync_path_at_one_rank(trainer.model, ctx.world_size)
        batches = trainer.train_loader.epoch(0)  # the caller sizes the epoch: no boundary inside the guarded steps
        for _ in range(3):  # warm-up: first-use allocations, cuDNN autotuning
            trainer.train_step(*next(batches))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(steps):
                trainer.train_step(*next(batches))
        except RuntimeError as exc:
            if "synchroniz" not in str(exc):  # an OOM or a cuDNN error is not a sync: report it as itself
                raise
            return str(exc).splitlines()[0][:160]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        trainer.flush_log()  # the one sync, outside the guarded loop
    return None


def sync_path_at_one_rank(model: nn.Module, world_size: int, function: Any = None) -> int:
    """Route every SyncBatchNorm of `model` through torch's own sync function; the count rerouted.

    Why: at world size 1 torch's SyncBatchNorm.forward falls back to plain batch norm (torch/nn/modules/
    batchnorm.py: `need_sync = world_size > 1`), so a one-GPU check would never see what every multi-GPU
    step runs. Called directly over the 1-rank group, torch.nn.modules._functions.SyncBatchNorm runs the
    same kernels, the same all-gather (of one) and the same boolean-mask indexing (`count_all[mask]`,
    whose result's shape depends on values on the device: a host sync) as with N ranks."""
    from torch import nn

    if function is None:
        from torch.nn.modules._functions import SyncBatchNorm as function
    rerouted = 0
    for module in model.modules():
        if isinstance(module, nn.SyncBatchNorm):
            # this module's forward replaced on purpose (an instance attribute shadowing the class's)
            module.forward = functools.partial(_synced_forward, module, function, world_size)  # type: ignore[method-assign]
            rerouted += 1
    return rerouted


def _synced_forward(module: nn.SyncBatchNorm, function: Any, world_size: int, input: Any) -> Any:
    from torch import distributed as tdist
    from torch import nn

    if not module.training:  # evaluation never syncs, in torch as here
        return nn.SyncBatchNorm.forward(module, input)
    assert module.num_batches_tracked is not None  # as torch's forward asserts: the lab tracks running statistics
    module.num_batches_tracked.add_(1)  # as torch's forward does; the lab's BatchNorm has momentum 0.1, no .item()
    group = module.process_group or tdist.group.WORLD
    return function.apply(
        input,
        module.weight,
        module.bias,
        module.running_mean,
        module.running_var,
        module.eps,
        module.momentum,
        group,
        world_size,
    )


def model_state_bytes(width: int) -> tuple[int, int, int]:
    """(bytes held after one SGD-momentum step of ResNet-18 of `width` with gradients kept, peak bytes during
    it, parameter count): model state counted as the memory estimator counts it, no activations."""
    # Twice, the second counts: the first use of cuBLAS/cuDNN allocates workspaces that then stay.
    _one_step_bytes(width)
    return _one_step_bytes(width)


def _one_step_bytes(width: int) -> tuple[int, int, int]:
    import gc

    import torch

    from lab.run.config import ModelConfig
    from lab.run.training import model as models

    device = torch.device("cuda", torch.cuda.current_device())
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    net = models.build(ModelConfig(width=width)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    torch.cuda.reset_peak_memory_stats(device)
    net(torch.randn(256, 3, 32, 32, device=device)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)  # gradients kept: the estimate counts them
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated(device) - before
    peak = torch.cuda.max_memory_allocated(device) - before
    params = sum(p.numel() for p in net.parameters())
    del net, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return state, peak, params


# ----------------------------------------------------------------------------- the child's command line


def _host_syncs(args: argparse.Namespace) -> dict[str, Any]:
    from lab.run import config
    from lab.run.training import runs

    result: dict[str, Any] = {"steps": args.steps, "variants": {}}
    for variant in args.variant:
        name, _, overrides = variant.partition(":")
        cfg = config.load(args.config, [*args.overrides, *filter(None, overrides.split(","))])
        result["variants"][name] = first_host_sync(cfg, args.steps)
        runs.write_json(args.json, result)  # after each variant: a cut child still leaves the ones it finished
    return result


def _model_state(args: argparse.Namespace) -> dict[str, Any]:
    from lab.run.training import runs

    state, peak, params = model_state_bytes(args.width)
    result = {"state_bytes": state, "peak_bytes": peak, "params": params}
    runs.write_json(args.json, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.machine.devicecheck.measure", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="what", required=True)
    syncs = commands.add_parser("host-syncs", help="the first host sync in training steps, per variant")
    syncs.add_argument("--config", required=True)
    syncs.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    syncs.add_argument("--steps", type=int, default=12, help="guarded steps per variant")
    syncs.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:K=V,K=V",
        help="a name and the overrides of one guarded run (repeat)",
    )
    syncs.add_argument("--json", required=True)
    syncs.set_defaults(measure=_host_syncs)
    state = commands.add_parser("model-state", help="model-state bytes after one step, against the estimator")
    state.add_argument("--width", type=int, default=64)
    state.add_argument("--json", required=True)
    state.set_defaults(measure=_model_state)
    args = parser.parse_args(argv)
    args.measure(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
