"""The grader's eyes inside a learner's process: torch patched from outside the learner's code, every event written
to this rank's trace as it happens.

The grader starts every rank as

    torchrun ... -m lab.course.exercises.observe --trace DIR FILE -- ARGS...      # FILE run as __main__, ARGS its argv
    torchrun ... -m lab.course.exercises.observe --trace DIR --probe lab.course.exercises.ring:probe FILE

and the learner's FILE (plain PyTorch: it never imports lab) runs unchanged. What it does is recorded in
DIR/rank-R.jsonl, one JSON object a line, flushed at once so a rank that hangs or is killed leaves what it did:

    start        rank, world size, pid
    init         init_process_group's backend
    ddp          DistributedDataParallel wrapped a model (its comm hook then counts each bucket's all-reduce)
    norm         a layer of the wrapped model that keeps running statistics (a `running_mean` buffer): its name,
                 momentum and starting buffers; then "norm_batch" at each of its forwards in training mode: the
                 per-channel sum and sum of squares of its input and the count, so the grader can work out the
                 statistics of the global batch (every rank's inputs together) that SyncBatchNorm would keep
    dataparallel nn.DataParallel wrapped a model: one process driving devices, not DDP
    fully_shard  FSDP2's fully_shard was applied
    epoch        a DataLoader began an iteration (its sampler's type, and its epoch where it has one)
    batch        the dataset indices a batch fetched (the samples this rank really read)
    coll         a collective entered ("enter", its sequence number on this rank, op, shapes, the learner's line)
                 and left ("exit"); an async call (async_op=True) is marked "async", "wait" is written when the
                 learner waits on its handle and "exit" when that returns; a bucket all-reduce of DDP counts as op
                 "ddp_allreduce"
    save, load   torch.save / torch.load: the path, and a saved state dict's keys' "module." prefix
    loss         the value of each F.cross_entropy computed with gradients on
    step         an optimizer step, with the bytes of model state this rank holds (parameters, gradients,
                 optimizer state; the local shard of a sharded tensor)
    print        each line the rank printed
    error        the exception that ended the learner's code, and its line there
    end          the program returned: each wrapped model's buffers and its parameters' sums

A learner cannot print their way past it: the checks read what torch was asked to do.
Only the standard library and torch are imported here, so it costs the learner's process nothing else.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import os
import runpy
import signal
import sys
from typing import Any

from lab import frozen_imports
from lab.course.exercises import norm_batches, stacks
from lab.course.exercises.recorder import Handle, Recorder, Tee, end, peak_bytes, state_bytes

frozen_imports.leave_alone()  # the learner's script is __main__ here: its globals finalised at exit, as by python

# Collectives a learner calls through torch.distributed: recorded once each (a collective torch runs inside
# another, all_gather_object's all_gather, is not counted twice).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "barrier",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)


def _tensors(args: tuple[Any, ...]) -> list[Any]:
    import torch

    found: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):  # a list of tensors, or batch_isend_irecv's P2POps (each holds one)
            found.extend(
                x if isinstance(x, torch.Tensor) else x.tensor
                for x in a
                if hasattr(x, "tensor") or isinstance(x, torch.Tensor)
            )
    return found


def _shapes(args: tuple[Any, ...]) -> list[list[int]]:
    import torch

    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(list(a.shape))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            found.append([len(a), *a[0].shape])
    return found


def _patch_collectives(rec: Recorder) -> None:
    import torch.distributed as dist

    def wrap(name: str, original: Any) -> Any:
        @functools.wraps(original)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(rec.inside, "depth", 0)
            if depth:
                return original(*args, **kwargs)
            seq = rec.next_sequence()
            in_flight = {"async": True} if kwargs.get("async_op") else {}
            rec.write("coll", phase="enter", seq=seq, op=name, shapes=_shapes(args), where=rec.where(), **in_flight)
            rec.inside.depth = depth + 1
            try:
                result = original(*args, **kwargs)
            finally:
                rec.inside.depth = depth
            # In flight until the caller waits on its handle; torch's own callers (DDP's join, ...) hand their Work
            # to its C++, which takes nothing else: theirs stays torch's, left at return as before.
            if kwargs.get("async_op") and result is not None and not _from_torch(sys._getframe(1)):
                return Handle(result, rec, seq, name, _tensors(args))
            rec.left(seq, name, _tensors(args), work=result)  # on NCCL: when the device is done, not at return
            return result

        return recorded

    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is not None:
            setattr(dist, name, wrap(name, original))
    _let_p2p_ops_take_recorded(dist)

    original_init = dist.init_process_group

    @functools.wraps(original_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original_init(*args, **kwargs)
        rec.write("init", backend=str(dist.get_backend()), world=dist.get_world_size(), where=rec.where())
        return result

    dist.init_process_group = init_process_group


def _from_torch(frame: Any) -> bool:
    return f"{os.sep}torch{os.sep}" in frame.f_code.co_filename


def _let_p2p_ops_take_recorded(dist: Any) -> None:
    """dist.P2POp(dist.isend, ...) refuses any op but torch's own isend/irecv ("Invalid ``op``"), and
    batch_isend_irecv tells the two apart with `is`: hand it the original under the recorded one. The batch itself
    is recorded, as op "batch_isend_irecv"."""
    p2p = getattr(dist, "P2POp", None)
    if p2p is None:
        return
    original_new, original_init = p2p.__new__, p2p.__init__

    def new(cls: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return original_new(cls, getattr(op, "__wrapped__", op), *args, **kwargs)

    def init(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, getattr(op, "__wrapped__", op), *args, **kwargs)

    p2p.__new__ = staticmethod(new)
    p2p.__init__ = init


def _patch_wrappers(rec: Recorder) -> None:
    import torch
    from torch import nn

    ddp_class = nn.parallel.DistributedDataParallel
    original_ddp_init = ddp_class.__init__

    def ddp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_ddp_init(self, *args, **kwargs)
        rec.models.append(self.module)
        rec.write("ddp", where=rec.where())
        norm_batches.watch(rec, len(rec.models) - 1, self.module)
        if not rec.count_ddp:  # a grader's own DDP (own-ddp's comparison) keeps torch's hook, or one of its own
            return
        try:
            self.register_comm_hook(None, _counting_allreduce(rec))
        except Exception as exc:  # a hook the learner set already, or a backend without hooks: counted as unknown
            rec.write("ddp_hook_refused", reason=str(exc)[:200])

    ddp_class.__init__ = ddp_init  # type: ignore[method-assign]

    dp_class = nn.DataParallel
    original_dp_init = dp_class.__init__

    def dp_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_dp_init(self, *args, **kwargs)
        rec.models.append(self.module)
        rec.write("dataparallel", where=rec.where())

    dp_class.__init__ = dp_init  # type: ignore[method-assign]

    try:  # FSDP2: torch.distributed.fsdp.fully_shard (torch >= 2.6)
        fsdp: Any = importlib.import_module("torch.distributed.fsdp")
        original_shard = fsdp.fully_shard

        def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_shard(module, *args, **kwargs)
            rec.models.append(module)
            rec.write("fully_shard", module=type(module).__name__, where=rec.where())
            return result

        for attribute in ("__name__", "__qualname__", "__doc__"):
            setattr(fully_shard, attribute, getattr(original_shard, attribute, None))
        fsdp.fully_shard = fully_shard
    except (ImportError, AttributeError):
        pass

    original_save, original_load = torch.save, torch.load

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_save(obj, f, *args, **kwargs)
        rec.write("save", path=_path(f), keys=_state_keys(obj), where=rec.where())
        return result

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        rec.write("load", path=_path(f), where=rec.where())
        return original_load(f, *args, **kwargs)

    torch.save, torch.load = save, load


def _counting_allreduce(rec: Recorder) -> Any:
    """DDP's default hook (all-reduce, then divide by the world size), each bucket's call recorded."""
    import torch
    import torch.distributed as dist

    def hook(state: Any, bucket: Any) -> Any:
        seq = rec.next_sequence()
        rec.write("coll", phase="enter", seq=seq, op="ddp_allreduce", bucket=bucket.index(), where="DDP backward")
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size())
        depth = getattr(rec.inside, "depth", 0)
        rec.inside.depth = depth + 1  # the all_reduce below is this ddp_allreduce: not recorded a second time
        try:
            future = dist.all_reduce(tensor, async_op=True).get_future()
        finally:
            rec.inside.depth = depth
        # Waited for here and handed back in a finished future of our own (as torch's noop_hook does), with no
        # Python callback chained on gloo's: a `future.then(python_function)` is released on gloo's worker thread,
        # which then needs the GIL, and torch 2.6 destroys the process group at exit holding the GIL while it joins
        # that thread: ranks hung at exit, now and then (the accumulate exercise's runs on the lowest torch).
        future.wait()
        # Held here too: a tensor Python has seen keeps its Python object, and where gloo's worker thread drops the
        # last reference it needs the GIL to free it, which torch 2.6's exit, joining that thread, holds.
        rec.buckets[bucket.index()] = tensor
        rec.left(seq, "ddp_allreduce", [tensor])  # on NCCL the wait above orders the stream: done when it is
        finished: Any = torch.futures.Future()
        finished.set_result(tensor)
        return finished

    # DDP refuses a hook whose `bucket` or return annotation is anything but GradBucket / Future[Tensor], and under
    # `from __future__ import annotations` they are strings ("Any"): no annotations at all, as torch accepts.
    hook.__annotations__ = {}
    return hook


def _path(f: Any) -> str:
    return os.path.realpath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__


def _state_keys(obj: Any) -> dict[str, list[str]]:
    """For each state dict in what was saved (the object itself, or its dict values): its first keys."""
    import torch

    found = {}
    candidates = {"": obj} if isinstance(obj, dict) else {}
    if isinstance(obj, dict):
        candidates.update({str(k): v for k, v in obj.items() if isinstance(v, dict)})
    for name, value in candidates.items():
        tensors = [k for k, v in value.items() if isinstance(v, torch.Tensor)]
        if tensors:
            found[name] = [str(k) for k in tensors[:64]]
    return found


def _patch_data(rec: Recorder) -> None:
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import fetch

    original_iter = DataLoader.__iter__

    def loader_iter(self: Any) -> Any:
        sampler = getattr(self, "sampler", None)
        rec.write("epoch", sampler=type(sampler).__name__, sampler_epoch=getattr(sampler, "epoch", None))
        return original_iter(self)

    DataLoader.__iter__ = loader_iter  # type: ignore[method-assign]

    original_fetch = fetch._MapDatasetFetcher.fetch

    def fetch_recorded(self: Any, possibly_batched_index: Any) -> Any:
        indices = possibly_batched_index if isinstance(possibly_batched_index, list) else [possibly_batched_index]
        rec.write("batch", idx=[int(i) for i in indices])
        return original_fetch(self, possibly_batched_index)

    fetch._MapDatasetFetcher.fetch = fetch_recorded  # type: ignore[method-assign]


def _patch_training(rec: Recorder) -> None:
    import torch
    import torch.nn.functional as F
    from torch.optim.optimizer import register_optimizer_step_post_hook

    original_ce = F.cross_entropy

    @functools.wraps(original_ce)
    def cross_entropy(*args: Any, **kwargs: Any) -> Any:
        loss = original_ce(*args, **kwargs)
        if torch.is_grad_enabled() and loss.dim() == 0:
            rec.loss(loss.detach())  # on CUDA read later, not here: no host sync in the learner's step loop
        return loss

    F.cross_entropy = cross_entropy
    torch.nn.modules.loss.F.cross_entropy = cross_entropy  # nn.CrossEntropyLoss calls it through its module

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        rec.settle()
        rec.write("step", state_bytes=state_bytes(optimizer), peak_bytes=peak_bytes())

    register_optimizer_step_post_hook(after_step)


def install(folder: str, learner_file: str | None) -> Recorder:
    rank = int(os.environ.get("RANK", "0"))
    rec = Recorder(folder, rank, learner_file)
    stacks.arm(folder, rank, learner_file)  # before "start": the grader asks only the ranks that wrote it
    rec.write("start", rank=rank, world=int(os.environ.get("WORLD_SIZE", "1")), pid=os.getpid())
    _patch_collectives(rec)
    _patch_wrappers(rec)
    _patch_data(rec)
    _patch_training(rec)
    sys.stdout = Tee(sys.stdout, rec)
    atexit.register(end, rec)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # the learner's own handler, set later, wins

        def on_sigterm(signum: int, frame: Any) -> None:
            rec.stopped(frame)
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
    return rec


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.course.exercises.observe", description=__doc__.split("\n")[0])
    parser.add_argument("--trace", required=True, help="the folder of the ranks' traces")
    parser.add_argument("--probe", help="MODULE:FUNCTION called with the learner's module (instead of running it)")
    parser.add_argument("file", help="the learner's Python file")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="after --: the file's own arguments")
    opts = parser.parse_args(argv)
    file_args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    rec = install(opts.trace, opts.file)
    sys.argv = [opts.file, *file_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(opts.file)))
    try:
        if opts.probe:
            module_name, function = opts.probe.split(":")
            learner = runpy.run_path(opts.file, run_name="learner")  # its functions, without its __main__ block
            getattr(importlib.import_module(module_name), function)(learner, rec, opts.trace)
        else:
            runpy.run_path(opts.file, run_name="__main__")
    except BaseException as exc:  # recorded, then raised on: the rank ends as the learner's code made it end
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            rec.write("error", text=f"{type(exc).__name__}: {exc}"[:300], where=_raised_at(exc, rec))
        raise


def _raised_at(exc: BaseException, rec: Recorder) -> str:
    """The learner's line the exception passed through last (the innermost in their file)."""
    found = "?"
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if rec.learner_file and os.path.realpath(filename) == rec.learner_file:
            found = f"{os.path.basename(filename)}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    return found


if __name__ == "__main__":
    main(sys.argv[1:])
