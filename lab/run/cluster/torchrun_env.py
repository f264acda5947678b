"""torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, ...), read in this one place.

torch-free on purpose: the CLI asks "am I under torchrun, am I rank 0?" before it
imports torch, so bad input is refused in a fraction of a second. A process started
without torchrun is rank 0 of a world of 1, unless horovodrun started it (dist.strategy=horovod): then its
layout is horovodrun's (lab.run.cluster.horovod_env).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple


class Layout(NamedTuple):
    global_rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int


def _int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def layout() -> Layout:
    """This process's place: torchrun's variables where torchrun's agent started it, horovodrun's where that did,
    else one process alone. RANK and WORLD_SIZE by themselves are not a launch: enroot's PyTorch hook exports them
    into every pyxis task, so `lab launch --slurm` on the second node would take itself for rank 1 (and keep its
    own refusals quiet, as a non-primary rank does)."""
    if launched_by_torchrun():
        return Layout(
            _int("RANK", 0),
            _int("LOCAL_RANK", 0),
            _int("WORLD_SIZE", 1),
            _int("LOCAL_WORLD_SIZE", 1),
            _int("GROUP_RANK", 0),
        )
    from lab.run.cluster import horovod_env

    if horovod_env.launched():
        return Layout(*horovod_env.layout())
    return Layout(0, 0, 1, 1, 0)


def launched_by_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """A worker of torchrun's agent: TORCHELASTIC_RUN_ID, which that agent alone sets, beside LOCAL_RANK. RANK,
    LOCAL_RANK and WORLD_SIZE alone prove nothing: enroot's PyTorch hook (pyxis with an NGC image, DeepOps turns it
    on) exports them from SLURM_* into every task, torchrun or not.

    >>> launched_by_torchrun({"LOCAL_RANK": "0", "WORLD_SIZE": "2", "RANK": "0"})  # enroot's hook, no torchrun
    False
    >>> launched_by_torchrun({"LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job7"})
    True
    """
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env


def is_primary_process() -> bool:
    """Global rank 0 (or no launcher at all): the process that prints errors and records."""
    return layout().global_rank == 0


def restart_count() -> int:
    """How many times torchrun restarted this worker group (0 on the first start)."""
    return _int("TORCHELASTIC_RESTART_COUNT", 0)


def rendezvous_id() -> str | None:
    """The job's rendezvous id (`--rdzv-id`; a random UUID under `--standalone`), None outside torchrun.

    It is the same for every node and survives restarts of the worker group."""
    value = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return value if value and value != "none" else None


def store_endpoint() -> tuple[str, int, bool]:
    """(MASTER_ADDR, MASTER_PORT, whether torchrun's agent serves the store there) for a worker."""
    return (
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        _int("MASTER_PORT", 29500),
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )
