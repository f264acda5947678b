"""Who am I, on which device, talking over which backend.

torchrun's environment comes from lab.run.cluster.torchrun_env (the one place that reads it).
A process started without torchrun is world size 1:
the single-device baseline is the same code with no process group
(`dist.single_process_group=true` builds a 1-rank group anyway, for the device check).

    with initialized(cfg.dist) as ctx:     # a process group when WORLD_SIZE > 1
        ...
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as tdist

from lab.errors import LaunchError
from lab.run.cluster import cores, expected_gpus, flight, horovod_env, slurm, torchrun_env, watchdog
from lab.run.config import DistConfig

T = TypeVar("T")  # the object a collective hands from rank to rank


@dataclass(frozen=True)
class DistContext:
    global_rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str | None  # None when there is no process group (world size 1)
    timeout_seconds: float = 600.0
    # A second, gloo group used only after a collective timed out, to find the rank(s) that stopped
    # answering: the default group's connections are closed by then.
    probe_group: tdist.ProcessGroup | None = None
    # Each rank's watch over its main thread (lab.run.cluster.watchdog): a stall becomes a diagnosis, a failed
    # collective leaves this rank's record for the launching parent's.
    watch: watchdog.Watchdog | None = None

    @property
    def is_primary(self) -> bool:
        """Global rank 0: the one process that prints, writes checkpoints and records."""
        return self.global_rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def device_ids(self) -> list[int] | None:
        """What DDP and barrier take as device_ids: this process's GPU, or None on the CPU."""
        return [self.device.index] if self.device.type == "cuda" else None


def choose_device(preference: str, local_rank: int, local_world_size: int = 1) -> torch.device:
    """This process's device: cuda:local_rank where it sees every GPU of the node, cuda:0 where it was given one
    GPU of its own (Slurm's --gpus-per-task, Kubernetes, Docker: one visible device per process).

    A process that sees one GPU while CUDA_VISIBLE_DEVICES is unset sees the node's only GPU, shared with the
    other local ranks: refused, as NCCL cannot put two ranks on one device."""
    if preference == "auto" and not torch.cuda.is_available():
        expected = expected_gpus.unseen()
        if expected:
            build = " (a CPU build)" if torch.version.cuda is None else ""
            raise LaunchError(
                f"dist.device=auto: {expected}, but torch {torch.__version__}{build} sees no CUDA device; a run "
                f"that expected GPUs does not train on the CPU: mend what hides them (the driver, the image, the "
                f"job's GPU request), or set dist.device=cpu to train on the CPU on purpose"
            )
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise LaunchError("dist.device: cuda was asked for but no CUDA device is visible; use dist.device=auto or cpu")
    visible = torch.cuda.device_count()
    local_world_size = max(local_world_size, local_rank + 1)  # a caller that knows only its local rank
    if visible >= local_world_size:
        return torch.device("cuda", local_rank)
    if visible == 1 and os.environ.get("CUDA_VISIBLE_DEVICES"):
        return torch.device("cuda", 0)
    raise LaunchError(
        f"dist.device: local rank {local_rank} of {local_world_size} processes on this node has no GPU of its own: "
        f"{visible} visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES') or 'unset'}); start at "
        f"most {visible} processes per node, or give each process one device of its own (CUDA_VISIBLE_DEVICES per "
        f"process, e.g. Slurm's --gpus-per-task=1)"
    )


def choose_backend(preference: str, device: torch.device) -> str:
    if preference == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if preference == "nccl" and device.type != "cuda":
        raise LaunchError("dist.backend: nccl needs CUDA devices; this process runs on the CPU, use gloo or auto")
    return preference


def init(cfg: DistConfig) -> DistContext:
    reason = slurm.foreign_launch()  # srun -n 16 or mpirun -np 16 without torchrun: 16 runs of world size 1
    if reason:
        raise LaunchError(reason)
    global_rank, local_rank, world_size, local_world_size, node_rank = torchrun_env.layout()
    device = choose_device(cfg.device, local_rank, local_world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cores.threads_per_process(local_world_size))
    backend = None
    # A sharding strategy needs a group (a device mesh) even alone: then one rank runs its code path unsharded.
    grouped = world_size > 1 or cfg.single_process_group or cfg.strategy != "ddp"
    if grouped:
        backend = choose_backend(cfg.backend, device)
        timeout = datetime.timedelta(seconds=cfg.timeout_seconds)
        # A 1-rank group started without torchrun has no one to meet: an in-process store is enough.
        alone = world_size == 1 and not torchrun_env.launched_by_torchrun()
        store: tdist.Store
        if alone:
            store = tdist.HashStore()
        elif horovod_env.launched() and not torchrun_env.launched_by_torchrun():  # horovodrun sets no MASTER_PORT
            from lab.run.cluster import horovod_rendezvous

            store = horovod_rendezvous.store(global_rank, world_size, timeout)
        else:
            store = _attempt_store(global_rank, world_size, timeout)
        if device.type == "cuda" and local_world_size > 1:
            refuse_shared_gpu(store, node_rank, local_rank, local_world_size, gpu_uuid(device))
        flight.enable()  # before the first group: the Flight Recorder reads its buffer size once
        tdist.init_process_group(
            backend=backend,
            store=store,
            rank=global_rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
        # a group of every rank: this rank is always a member, never the _NonGroupMember new_group may return
        probe_group = cast(
            tdist.ProcessGroup,
            tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=cfg.timeout_seconds)),
        )
    watch = None
    if world_size > 1 and cfg.hang_seconds > 0:
        # at most half the collective's timeout: the diagnosis comes while the collective still waits
        watch = watchdog.Watchdog(global_rank, world_size, min(cfg.hang_seconds, cfg.timeout_seconds / 2)).start()
    return DistContext(
        global_rank,
        local_rank,
        world_size,
        local_world_size,
        node_rank,
        device,
        backend,
        cfg.timeout_seconds,
        probe_group if grouped else None,
        watch,
    )


def gpu_uuid(device: torch.device) -> str:
    """The physical GPU behind a torch device (its UUID: the same GPU under any CUDA_VISIBLE_DEVICES numbering)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def refuse_shared_gpu(store: tdist.Store, node_rank: int, local_rank: int, local_world_size: int, uuid: str) -> None:
    """Two local ranks on one GPU: refused, naming them, before NCCL would stop with "Multiple Ranks are using the
    same GPU" (or DeepSpeed set a device that does not exist). A process sees one GPU both when it was given one of
    its own and when every worker of torchrun inherited one CUDA_VISIBLE_DEVICES: only comparing the GPUs the
    node's ranks took tells them apart. Each rank writes its GPU into the store under its node and reads its
    node's others (local ranks^2 reads a node, none across nodes)."""
    store.set(f"lab/gpu/{node_rank}/{local_rank}", uuid)
    keys = [f"lab/gpu/{node_rank}/{r}" for r in range(local_world_size)]
    store.wait(keys)
    taken: dict[str, list[int]] = {}
    for r, key in enumerate(keys):
        taken.setdefault(store.get(key).decode(), []).append(r)
    shared = {gpu: ranks for gpu, ranks in taken.items() if len(ranks) > 1}
    if shared:
        gpu, ranks = next(iter(shared.items()))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") or "unset"
        raise LaunchError(
            f"dist.device: local ranks {', '.join(map(str, ranks))} of node {node_rank} are all on GPU {gpu} "
            f"(CUDA_VISIBLE_DEVICES={visible}, which torchrun gives every worker alike); start at most "
            f"{len(taken)} process(es) per node here, or show each worker its own GPU"
        )


RANK0_SPEAKS_SECONDS = 3.0  # after a timeout, the others' wait before they exit (explain_timeout)


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than dist.timeout_seconds; the message names the ranks that did not answer."""


def is_collective_timeout(exc: BaseException) -> bool:
    """gloo's timeout ('Timed out waiting ... for recv operation'). On GPUs, torchrun turns on NCCL's
    async error handling: its watchdog aborts a hung process group itself, with its own report."""
    return isinstance(exc, RuntimeError) and "Timed out waiting" in str(exc)


def explain_timeout(ctx: DistContext) -> CollectiveTimeout:
    """After a collective timed out, meet at a monitored barrier on the probe group: rank 0 learns which
    ranks never come (stuck or dead) and names them. Every rank that timed out takes part; the others wait
    longer than rank 0, so rank 0 speaks before torchrun tears the group down."""
    limit = min(ctx.timeout_seconds, 60.0)  # the others time out at about the same moment; do not wait long
    failure = None
    try:
        tdist.monitored_barrier(
            group=ctx.probe_group,
            wait_all_ranks=True,
            timeout=datetime.timedelta(seconds=limit if ctx.is_primary else 2 * limit),
        )
    except RuntimeError as exc:
        failure = str(exc)
    what = (
        f"rank {ctx.global_rank}: a collective did not complete within {ctx.timeout_seconds:g} s (dist.timeout_seconds)"
    )
    if failure is None:
        return CollectiveTimeout(
            f"{what}; every rank answered a check afterwards, so one was slow, not stuck: "
            f"raise dist.timeout_seconds if that is expected"
        )
    if not ctx.is_primary:
        if "successfully reached monitoredBarrier" in failure:  # rank 0 answered and found someone missing
            # Rank 0 learned it at the same moment and is saying it (its summary, then its line: lifecycle._fit).
            # The first rank to exit makes torchrun stop the rest, so this one leaves a moment later; without the
            # wait a rank 0 stopped before it printed left the run's reason unsaid (2 runs in 3 on torch 2.6).
            time.sleep(RANK0_SPEAKS_SECONDS)
            return CollectiveTimeout(f"{what}; rank 0's error names the rank(s) that stopped answering")
        return CollectiveTimeout(f"{what}; rank 0 did not answer within {2 * limit:g} s more: stuck or dead")
    found = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", failure)
    if found is None:
        return CollectiveTimeout(f"{what}; the check afterwards failed too ({failure.splitlines()[0][:200]})")
    return CollectiveTimeout(
        f"{what}; rank(s) {found.group(1).strip()} did not answer within {limit:g} s more: stuck or dead"
    )


def _attempt_store(rank: int, world_size: int, timeout: datetime.timedelta) -> tdist.Store:
    """The store the process group meets in, with keys of this torchrun attempt only.

    torchrun's agent keeps one store for the whole job; the keys a worker group writes there (each
    rank's gloo address) outlive the group. After a restart, a rank could read the dead attempt's
    address and fail with "connectFullMesh ... Connection refused" (a test that SIGKILLs a rank saw it
    about every other run). One prefix per attempt keeps each group to its own keys."""
    host, port, agent_serves = torchrun_env.store_endpoint()
    store = tdist.TCPStore(host, port, world_size, is_master=not agent_serves and rank == 0, timeout=timeout)
    return tdist.PrefixStore(f"lab/attempt-{torchrun_env.restart_count()}", store)


def teardown(ctx: DistContext) -> None:
    if ctx.watch is not None:
        ctx.watch.stop()
    if ctx.distributed and tdist.is_initialized():
        tdist.destroy_process_group()


GLOO_SETTLE_SECONDS = 0.2  # the GIL left to gloo's worker threads before the group goes (initialized, below)


@contextlib.contextmanager
def initialized(cfg: DistConfig) -> Iterator[DistContext]:
    """init(cfg) for the length of a with-block; the process group is torn down however the block ends.

    A block that ends normally meets at a barrier first, then lets gloo's worker threads finish. Why: those
    threads release each finished collective's tensors after the caller has moved on; a tensor Python has seen
    needs the GIL to be freed, and on torch 2.6 the group's destructor (run when DDP's Reducer lets the group
    go) joins those threads while holding the GIL, so a release still in flight deadlocks the exit. The barrier
    alone did not settle it: its own work keeps the collectives still in progress when it was queued, and a
    worker frees them after the barrier returned (a clean-clone run on torch 2.6 hung so, once: the main thread
    in ~ProcessGroupGloo's join, the worker in ~AsyncBarrierWork waiting for the GIL). The pause gives the GIL to
    the workers for that moment. Not after an error: a rank that is gone would keep the others at the barrier
    until the timeout."""
    ctx = init(cfg)
    try:
        yield ctx
        # Inside the failure path's reach: a rank left alone at this barrier (a peer stuck in a collective this rank
        # skipped) is recorded when it times out, as in the block. Outside it, with its watchdog late to sample the
        # stall on loaded cores, such a rank was named dead with no record: 6 of 6 planted runs side by side on 2
        # cores, 0 of 6 since (tests/distributed/test_hang.py's skip case).
        barrier(ctx)
    except BaseException as exc:
        # What this rank's collectives were, for the diagnosis after the run; not for a refusal (a LabError, said
        # at once: a dump's fraction of a second could let torchrun stop this rank before it is printed) nor an
        # interrupt.
        if ctx.watch is not None and watchdog.raised_failure(exc):
            said = str(exc).splitlines()[0][:300] if str(exc) else ""
            ctx.watch.dump(f"raised {type(exc).__name__}: {said}", overwrite=False, failed=True)
        teardown(ctx)
        raise
    if ctx.backend == "gloo":
        time.sleep(GLOO_SETTLE_SECONDS)
    teardown(ctx)


# ----------------------------------------------------------------------------- collectives
# No-ops at world size 1, so the trainer has one code path.


def all_reduce_sum(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    if ctx.distributed:
        tdist.all_reduce(tensor, op=tdist.ReduceOp.SUM)
    return tensor


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        tdist.barrier(device_ids=ctx.device_ids)


def broadcast_object(ctx: DistContext, obj: T) -> T:
    """Rank 0's `obj` on every rank."""
    if not ctx.distributed:
        return obj
    holder = [obj]
    tdist.broadcast_object_list(holder, src=0)
    return holder[0]


def all_gather_object(ctx: DistContext, obj: T) -> list[T]:
    if not ctx.distributed:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size  # filled in place, one object per rank
    tdist.all_gather_object(gathered, obj)
    return gathered


def broadcast_from_primary(ctx: DistContext, tensors: list[torch.Tensor]) -> None:
    """Overwrite `tensors` on every rank with rank 0's values (in place)."""
    if ctx.distributed:
        for tensor in tensors:
            tdist.broadcast(tensor.data, src=0)


def primary_then_broadcast(ctx: DistContext, fn: Callable[[], T]) -> T:
    """Run `fn` on global rank 0 and give its result to every rank.

    A LabError raised by `fn` is raised on every rank with the same message, so no
    rank waits forever at the next collective for a peer that already gave up.
    """
    from lab.errors import LabError

    payload: tuple[Any, ...] | None = None
    if ctx.is_primary:
        try:
            payload = ("ok", fn())
        except LabError as exc:
            payload = ("error", type(exc), str(exc))
        except BaseException as exc:
            broadcast_object(ctx, ("failed", f"{type(exc).__name__}: {exc}"))
            raise
    payload = broadcast_object(ctx, payload)
    assert payload is not None  # rank 0 always sends one; it replaces the other ranks' None
    if payload[0] == "error":
        raise payload[1](payload[2])
    if payload[0] == "failed":
        raise RuntimeError(f"rank 0 failed: {payload[1]}")
    return payload[1]
