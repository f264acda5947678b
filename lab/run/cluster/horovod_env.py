"""horovodrun's environment (HOROVOD_RANK, HOROVOD_SIZE, ...), read in this one place, as torchrun_env reads
torchrun's. torch-free: the CLI asks "am I rank 0?" before it imports torch.

horovodrun --gloo starts each process with its rank, the job's size and the node's (HOROVOD_LOCAL_*), the node's
rank among the nodes (HOROVOD_CROSS_RANK) and the address of its own rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR),
but no MASTER_ADDR or MASTER_PORT: lab.run.cluster.horovod_rendezvous builds torch.distributed's store from Horovod.

>>> layout({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
...         "HOROVOD_CROSS_RANK": "1"})
(3, 1, 4, 2, 1)
>>> launched({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}), launched({})
(True, False)
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def launched(env: Mapping[str, str] | None = None) -> bool:
    """Started by horovodrun (or anything that sets Horovod's rank and size)."""
    env = os.environ if env is None else env
    return "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env


def layout(env: Mapping[str, str] | None = None) -> tuple[int, int, int, int, int]:
    """(global rank, local rank, world size, local world size, node rank): torchrun_env.Layout's fields."""
    env = os.environ if env is None else env

    def number(name: str, default: int) -> int:
        value = env.get(name)
        return int(value) if value not in (None, "") else default

    return (
        number("HOROVOD_RANK", 0),
        number("HOROVOD_LOCAL_RANK", 0),
        number("HOROVOD_SIZE", 1),
        number("HOROVOD_LOCAL_SIZE", 1),
        number("HOROVOD_CROSS_RANK", 0),
    )
