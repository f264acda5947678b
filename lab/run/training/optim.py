"""What a step does to the weights: the optimizer, the learning-rate schedule and the autocast precision.

Functions of the config (and the device), each testable alone; the Trainer only calls them.

>>> import torch
>>> from lab.run import config
>>> cfg = config.load("smoke", ["train.warmup_steps=2", "train.schedule=cosine"])
>>> model = torch.nn.Linear(4, 2)
>>> opt = build_optimizer(model, cfg.train, torch.device("cpu"))
>>> [g["weight_decay"] for g in opt.param_groups]          # weights decay; the bias (1-d) does not
[0.0005, 0.0]
>>> schedule = build_schedule(opt, cfg.train, total_steps=10, origin="smoke")
>>> [round(lr_factor(s, 2, 10, "cosine"), 3) for s in (0, 1, 2, 6, 10)]   # warm-up, peak, half-way, end
[0.5, 1.0, 1.0, 0.5, 0.0]
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from lab import compat
from lab.errors import ConfigError
from lab.run.config import TrainConfig


def build_optimizer(model: nn.Module, t: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """SGD with momentum; weight decay on weights only (norms and biases are 1-d)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        (decay if p.ndim > 1 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.SGD(
        groups,
        lr=t.lr,
        momentum=t.momentum,
        nesterov=t.nesterov and t.momentum > 0,
        **sgd_kernel(decay + no_decay, device),
    )


def sgd_kernel(params: Sequence[torch.Tensor], device: torch.device) -> dict[str, bool]:
    """SGD's implementation for `params` on `device`: {"fused": True} (one kernel for every tensor) where torch
    has a fused kernel for the device and every parameter is a plain tensor, else {"foreach": True}.

    A tensor subclass dispatches each op through its own table: FSDP2's DTensor has sharding rules for fused
    Adam/AdamW but not for aten._fused_sgd_ (NotImplementedError at the first step), and for every foreach op.
    The CPU keeps foreach although torch fuses SGD there too: its fused kernel's rounding depends on where an
    element sits in its tensor (measured, 5 Nesterov steps: the same tensors stepped one by one or flattened
    into one differ by an ulp on 2 of 1,111 elements; fused against foreach, 3 of 1,040), so DDP's tensors,
    ZeRO's flat partitions and FSDP's shards would part by ulps, where with foreach the strategies' curves
    agree bit for bit on CPU. The CUDA choice is tested on CPU tensors by passing a CUDA `device` (fused SGD
    runs on CPU tensors too).

    >>> sgd_kernel([torch.zeros(2)], torch.device("cuda")), sgd_kernel([torch.zeros(2)], torch.device("cpu"))
    ({'fused': True}, {'foreach': True})
    """
    plain = all(type(p) in (torch.Tensor, nn.Parameter) and p.is_floating_point() for p in params)
    if device.type != "cpu" and device.type in compat.fused_optimizer_devices() and plain:
        return {"fused": True}
    return {"foreach": True}


KERNEL_KEYS = ("foreach", "fused")


@contextlib.contextmanager
def own_kernels(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Load an optimizer's state inside this: the kernel flags it had (`sgd_kernel`'s choice for this run's
    device) are put back after. torch's load_state_dict restores the saved groups' `foreach` and `fused`, so a
    checkpoint written where SGD ran foreach (a CPU, a torch without a fused kernel) would switch a GPU run to
    foreach, where GradScaler's found_inf is refused at the first fp16 step ("Expected grad_scale and found_inf to
    be None"). Which kernel runs is a fact of this run, not of the checkpoint.

    >>> w = torch.zeros(1, requires_grad=True)
    >>> opt = torch.optim.SGD([w], lr=0.1, fused=True)
    >>> with own_kernels(opt):
    ...     opt.load_state_dict(torch.optim.SGD([w], lr=0.1, foreach=True).state_dict())
    >>> opt.param_groups[0]["fused"], opt.param_groups[0]["foreach"]
    (True, None)
    """
    chosen = [{key: group.get(key) for key in KERNEL_KEYS} for group in optimizer.param_groups]
    yield
    for group, kernel in zip(optimizer.param_groups, chosen):
        group.update(kernel)


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """The learning rate over train.lr after `step` optimizer steps: linear warm-up, then constant or a
    half cosine to zero at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_schedule(
    optimizer: torch.optim.Optimizer, t: TrainConfig, total_steps: int, origin: str
) -> torch.optim.lr_scheduler.LRScheduler:
    """train.schedule over `total_steps` optimizer steps; `origin` names the config in errors."""
    if t.schedule == "onecycle":
        if total_steps < 2:
            raise ConfigError(
                f"{origin}: train.schedule: onecycle needs at least 2 steps, this run has "
                f"{total_steps}; use cosine or more steps"
            )
        rising = min(max(t.warmup_steps or round(0.3 * total_steps), 1), total_steps - 1)  # OneCycleLR's 0.3
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=t.lr, total_steps=total_steps, pct_start=rising / total_steps
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, t.warmup_steps, total_steps, t.schedule)
    )


def choose_amp(
    want: str, model_dtype: torch.dtype, device: torch.device, say: Callable[[str], None] = print
) -> torch.dtype | None:
    """The autocast dtype for train.amp on `device`, or None for full precision; `say` explains a downgrade.

    >>> choose_amp("auto", torch.float32, torch.device("cpu")) is None   # auto: AMP on GPUs only
    True
    >>> choose_amp("bf16", torch.float32, torch.device("cpu"))
    torch.bfloat16
    """
    if want == "off" or (want == "auto" and device.type != "cuda"):
        return None
    if model_dtype == torch.float64:
        say("train.amp: off, because model.dtype is float64")
        return None
    if device.type == "cuda":
        if want in ("auto", "bf16") and not torch.cuda.is_bf16_supported():
            say(f"train.amp: {torch.cuda.get_device_name(device)} has no bf16; running without AMP")
            return None
        return torch.float16 if want == "fp16" else torch.bfloat16
    if want == "fp16":
        say("train.amp: fp16 autocast is for GPUs; running the CPU without AMP")
        return None
    return torch.bfloat16  # CPU autocast supports bf16


def autocast(device: torch.device, amp_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to `amp_dtype` on `device`, or nothing when it is None."""
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp_dtype)
