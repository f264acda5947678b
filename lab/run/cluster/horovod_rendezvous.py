"""torch.distributed's store for a job that horovodrun started (dist.strategy=horovod).

Under Horovod the lab keeps two groups, as under DeepSpeed it keeps one that DeepSpeed adopts: Horovod's own
(gloo or NCCL, in its background thread) carries the gradients of `hvd.DistributedOptimizer` and the initial
broadcasts; torch.distributed's gloo group carries the lab's own bookkeeping (evaluation's counts, the loss,
barriers, a checkpoint sent from rank 0), so the Trainer is the same code under every strategy. horovodrun
sets no MASTER_ADDR or MASTER_PORT: rank 0 serves a TCPStore on a free port of its host, and Horovod's own
broadcast, which works as soon as `hvd.init()` has met horovodrun's rendezvous, tells the other ranks where.
A free port chosen by the server itself cannot collide with another job's, as a fixed one could.
"""

from __future__ import annotations

import datetime
import os
import socket
from types import ModuleType

import torch.distributed as tdist

from lab.errors import LaunchError
from lab.run.cluster.horovodrun import INSTALL


def import_horovod() -> ModuleType:
    """horovod.torch, or one line saying how to get it. Its timeline made startable at run time first (Horovod
    reads HOROVOD_TIMELINE once, at hvd.init): the strategy records the first steps into the run directory."""
    os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        missing = getattr(exc, "name", None) or "horovod"
        raise LaunchError(
            f"dist.strategy: horovod needs Horovod, missing here ({missing}): {INSTALL}; or dist.strategy=ddp"
        ) from None
    return hvd


def rank0_address(hvd: ModuleType) -> str:
    """Where the other ranks reach rank 0: loopback when every rank is on its node, else rank 0's host as
    horovodrun named it (-H HOST:SLOTS), resolved on rank 0."""
    if hvd.local_size() == hvd.size():
        return "127.0.0.1"
    return socket.gethostbyname(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())


def store(rank: int, world_size: int, timeout: datetime.timedelta) -> tdist.Store:
    hvd = import_horovod()
    hvd.init()  # the strategy checks Horovod's rank and size against the lab's (one place, for every launch)
    server = None
    if rank == 0:  # port 0: the server binds a free one; wait_for_workers=False: they learn of it only below
        server = tdist.TCPStore("0.0.0.0", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
    host, port = hvd.broadcast_object(
        (rank0_address(hvd), server.port) if server else None, root_rank=0, name="lab.store_endpoint"
    )
    return server or tdist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
