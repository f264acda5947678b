"""The grader's side of `own-ddp`, run in every rank by `lab.course.exercises.observe --probe`: it builds its own
model, wraps it in the learner's class and trains it a few steps, twice (stage 1: bucket_mb=0, stage 2: BUCKET_MB),
then times the learner's class beside torch's DistributedDataParallel. What it finds goes to the rank's trace as
"probe" events; the collectives between them are the observer's own records of what the learner's class did.

    probe what="stage", stage, bucket_mb                    a stage begins
    probe what="initial", sums                              each parameter's (sum, norm) before the learner's class
                                                            saw it (each rank seeds its own: rank 0's must win)
    probe what="constructed", sums                          the same, right after the class was built
    probe what="step", phase="begin"/"backward"/"finished"  around each step: "backward" when loss.backward()
                                                            returned, "finished" when finish() did
    probe what="grad", name                                 a trainable parameter's gradient accumulated (the
                                                            probe's hook runs before the learner's on each)
    probe what="weights", largest, where, compared, summed  rank 0: every weight after the stage's steps against
                                                            one process on the whole batch from rank 0's weights
                                                            (summed: against gradients summed, not averaged)
    probe what="final", sums                                each parameter's (sum, norm) after the stage
    probe what="ddp_step", phase="begin"/"end"              around one step of torch's DDP on the same model,
    probe what="ddp_bucket", index                          each of its buckets' all-reduces launched
    probe what="timing", yours, ddp                         seconds a step (median), in alternating blocks
    probe what="error", stage, text, where                  the learner's class raised (the rank then exits)
    probe what="missing", name                              the file has no such class
    probe what="no-buckets"                                 the class takes no bucket size: stage 2 not run

The learner's file is loaded as a module, not run: its __main__ block never runs here. The class is MyDDP unless
the file's arguments say `--class NAME`; its finish() may be called finish_gradient_synchronization() (Stanford
CS336's name), and an on_train_batch_start() is called before each step where it has one.
"""

from __future__ import annotations

import copy
import inspect
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lab.course.exercises import probe_rank

CLASS = "MyDDP"
BUCKET_MB = 0.3  # stage 2: 2 or 3 buckets of this model's 8 gradients, whichever rule and MB or MiB (check.py)
STEPS = 3  # a stage's graded steps
PER_RANK = 8  # samples a rank a step
LR = 0.1
TIMED_STEPS = 8  # a timing block's steps, after one untimed
BLOCKS = 3  # timing blocks of each, alternating
SEED = 0
HELD: list[Any] = []  # DDP's bucket tensors, kept to the process's end: gloo's thread never frees one Python saw


def build_model(seed: int) -> nn.Module:
    """The grader's model: a frozen input layer (no gradient: never all-reduced), three 256-wide layers and a head.
    The frozen layer is the same on every rank; the rest seeded per rank, so only a broadcast makes them equal."""
    torch.manual_seed(SEED)
    frozen = nn.Linear(32, 256).requires_grad_(False)
    torch.manual_seed(seed)
    return nn.Sequential(
        frozen,
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )


def trainable_bytes(model: nn.Module) -> list[int]:
    """Each trainable parameter's bytes in the model's order (check.py's bucket arithmetic)."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def frozen_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if not p.requires_grad)


def batch(step: int, world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s global batch (PER_RANK x world samples), the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    inputs = torch.randn(PER_RANK * world, 32, generator=g)
    return inputs.to(device), torch.randint(0, 10, (PER_RANK * world,), generator=g).to(device)


def sums(model: nn.Module) -> dict[str, list[float]]:
    return {n: [float(p.detach().sum()), float(p.detach().norm())] for n, p in model.named_parameters()}


def _learner_class(learner: dict[str, Any]) -> tuple[str, Any]:
    args = sys.argv[1:]
    name = args[args.index("--class") + 1] if "--class" in args[:-1] else CLASS
    return name, learner.get(name)


def _takes_buckets(cls: Any) -> bool:
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)


def _finisher(wrapper: Any) -> Any:
    """finish(), or CS336's finish_gradient_synchronization(); torch's DDP has neither (its backward waits)."""
    return getattr(wrapper, "finish", None) or getattr(wrapper, "finish_gradient_synchronization", lambda: None)


class _GradientMarks:
    """The probe's own hook on each trainable parameter, registered before the learner's (hooks run in the order
    they were registered): a "grad" event as each gradient is accumulated, while `on`."""

    def __init__(self, model: nn.Module, recorder: Any) -> None:
        self.on = False
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._marker(name, recorder))

    def _marker(self, name: str, recorder: Any) -> Any:
        def mark(_: torch.Tensor) -> None:
            if self.on:
                recorder.write("probe", what="grad", name=name)

        return mark


def _step(wrapper: Any, model: nn.Module, optimizer: Any, step: int, device: torch.device, recorder: Any) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs, targets = batch(step, world, device)
    mine = slice(PER_RANK * rank, PER_RANK * (rank + 1))
    if recorder:
        recorder.write("probe", what="step", phase="begin", step=step)
    if hasattr(wrapper, "on_train_batch_start"):
        wrapper.on_train_batch_start()
    loss = F.cross_entropy(wrapper(inputs[mine]), targets[mine])
    loss.backward()
    if recorder:
        recorder.write("probe", what="step", phase="backward", step=step)
    _finisher(wrapper)()
    if recorder:
        recorder.write("probe", what="step", phase="finished", step=step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _single_process(model: nn.Module, device: torch.device, lr: float = LR) -> nn.Module:
    """Rank 0's starting weights trained in this process on each step's whole batch: what every rank must reach.
    (At world size x the rate: where the ranks' gradients were summed and never divided.)"""
    world = dist.get_world_size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(STEPS):
        inputs, targets = batch(step, world, device)
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def _compare(model: nn.Module, reference: nn.Module) -> dict[str, Any]:
    largest, where, compared = 0.0, "", 0
    theirs = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        difference = float((p.detach() - theirs[name].detach()).abs().max())
        compared += p.numel()
        if difference > largest:
            largest, where = difference, name
    return {"largest": largest, "where": where, "compared": compared}


def stage(cls: Any, number: int, bucket_mb: float, device: torch.device, recorder: Any) -> Any:
    """One graded stage: the learner's class on the grader's model, STEPS steps, measured. Returns the wrapper."""
    recorder.write("probe", what="stage", stage=number, bucket_mb=bucket_mb)
    model = build_model(seed=100 + dist.get_rank()).to(device)
    reference = copy.deepcopy(model) if dist.get_rank() == 0 else None
    recorder.write("probe", what="initial", sums=sums(model))
    marks = _GradientMarks(model, recorder)
    try:
        wrapper = cls(model, bucket_mb) if _takes_buckets(cls) else cls(model)
        recorder.write("probe", what="constructed", sums=sums(model))
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        marks.on = True
        for step in range(STEPS):
            _step(wrapper, model, optimizer, step, device, recorder)
        marks.on = False
    except Exception as exc:
        recorder.write("probe", what="error", stage=number, text=f"{type(exc).__name__}: {exc}"[:300])
        raise
    if reference is not None:
        summed = _compare(model, _single_process(copy.deepcopy(reference), device, LR * dist.get_world_size()))
        found = _compare(model, _single_process(reference, device))
        recorder.write("probe", what="weights", summed=summed["largest"], **found)
    recorder.write("probe", what="final", sums=sums(model))
    return wrapper


def _ddp_hook(recorder: Any) -> Any:
    """DDP's own all-reduce (divide, sum) with each bucket's launch recorded, the future handed back unwaited."""

    def hook(state: Any, bucket: Any) -> Any:
        tensor = bucket.buffer().div_(dist.get_world_size())
        recorder.write("probe", what="ddp_bucket", index=bucket.index())
        depth = getattr(recorder.inside, "depth", 0)
        recorder.inside.depth = depth + 1  # DDP's own all-reduce: not one of the learner's collectives
        try:
            future = dist.all_reduce(tensor, async_op=True).get_future()
        finally:
            recorder.inside.depth = depth
        HELD.append(tensor)  # see HELD, and observe.py's own DDP hook
        return future.then(lambda f: f.value()[0])

    hook.__annotations__ = {}  # DDP checks a hook's annotations; these are strings here (see observe.py)
    return hook


def _timed(wrapper: Any, model: nn.Module, device: torch.device, first_step: int) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    seconds = []
    for k in range(TIMED_STEPS + 1):
        dist.barrier()
        started = time.perf_counter()
        _step(wrapper, model, optimizer, first_step + k, device, None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def _ddp(model: nn.Module, device: torch.device, recorder: Any) -> Any:
    recorder.count_ddp = False
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=BUCKET_MB
    )
    recorder.count_ddp = True
    ddp.register_comm_hook(None, _ddp_hook(recorder))
    return ddp


def timing(cls: Any, device: torch.device, recorder: Any) -> None:
    """Seconds a step of the learner's class (stage 2's buckets) and of torch's DDP on the same model, in
    alternating blocks; and one DDP step with its buckets' launches and the gradients marked (its overlap)."""
    rank = dist.get_rank()
    yours_model, ddp_model = build_model(100 + rank).to(device), build_model(100 + rank).to(device)
    yours = cls(yours_model, BUCKET_MB)
    marks = _GradientMarks(ddp_model, recorder)
    ddp = _ddp(ddp_model, device, recorder)
    ddp_optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    _step(ddp, ddp_model, ddp_optimizer, 0, device, None)  # DDP rebuilds its buckets after its first backward
    marks.on = True
    recorder.write("probe", what="ddp_step", phase="begin")
    _step(ddp, ddp_model, ddp_optimizer, 1, device, None)
    recorder.write("probe", what="ddp_step", phase="end")
    marks.on = False
    mine, theirs = [], []
    for block in range(BLOCKS):
        mine += _timed(yours, yours_model, device, 100 * block)
        theirs += _timed(ddp, ddp_model, device, 100 * block)
    recorder.write("probe", what="timing", yours=statistics.median(mine), ddp=statistics.median(theirs))


def probe(learner: dict[str, Any], recorder: Any, trace_dir: str) -> None:
    device = probe_rank.setup()
    name, cls = _learner_class(learner)
    if cls is None:
        recorder.write("probe", what="missing", name=name)
    else:
        stage(cls, 1, 0.0, device, recorder)
        if _takes_buckets(cls):
            stage(cls, 2, BUCKET_MB, device, recorder)
            timing(cls, device, recorder)
        else:
            recorder.write("probe", what="no-buckets", name=name)
    dist.barrier()
    dist.destroy_process_group()
