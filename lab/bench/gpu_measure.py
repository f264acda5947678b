"""What the GPU check measures inside its own process, on the CUDA device, rather than through a `lab`
command: whether the training step syncs with the host, and how many bytes the model state holds.

Both need a CUDA device (set_sync_debug_mode and the allocator's counters exist only there);
`lab.bench.gpu_check` decides whether to call them and what their numbers mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.config import Config


def first_host_sync(cfg: Config, steps: int) -> str | None:
    """The first host sync inside `steps` training steps of `cfg` (CUDA's sync debug mode set to "error"),
    or None when there is none. The trainer's one sync per log interval comes after the guarded steps."""
    import torch

    from lab import data, dist
    from lab.trainer import Trainer

    with dist.initialized(cfg.dist) as ctx:
        trainer = Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device))
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


def model_state_bytes(width: int) -> tuple[int, int, int]:
    """(bytes held after one SGD-momentum step of ResNet-18 of `width` with gradients kept, peak bytes during
    it, parameter count): model state counted as the memory estimator counts it, no activations."""
    # Twice, the second counts: the first use of cuBLAS/cuDNN allocates workspaces that then stay.
    _one_step_bytes(width)
    return _one_step_bytes(width)


def _one_step_bytes(width: int) -> tuple[int, int, int]:
    import gc

    import torch

    from lab import model as models
    from lab.config import ModelConfig

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
