"""The horovodrun command line for dist.strategy=horovod, built in one place (as lab.run.cluster.launch builds
torchrun's), and the one-line refusals of a Horovod run that cannot start. torch-free: the CLI refuses before
it imports torch.

>>> " ".join(horovodrun_command(2, ["-m", "lab", "train"], python="python"))
'python -m horovod.runner.launch -np 2 -H localhost:2 --gloo --gloo-timeout-seconds 600 --start-timeout 600 python -m
lab train'
"""

from __future__ import annotations

import importlib.util
import math
import sys

from lab.errors import LabError
from lab.run.cluster import torchrun_env

INSTALL = "third_party/horovod/build.sh (make horovod) builds and installs it"


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or one set to None
        return False


def check_installed() -> None:
    """Horovod and horovodrun's own imports are here, or one line saying what is missing and how to get it."""
    if not (_found("horovod") and _found("horovod.torch")):
        raise LabError(
            f"dist.strategy: horovod needs Horovod, not installed in {sys.executable}: {INSTALL}; or dist.strategy=ddp"
        )
    missing = [name for name in ("cloudpickle", "psutil") if not _found(name)]
    if missing:
        raise LabError(
            f"horovodrun cannot start: {', '.join(missing)} missing in {sys.executable} (horovodrun "
            f"imports them); pip install {' '.join(missing)}, or {INSTALL}"
        )


NOT_UNDER_TORCHRUN = (
    "dist.strategy: horovod runs under horovodrun, not torchrun: `lab train --nproc-per-node N "
    "--set dist.strategy=horovod` starts it, or `horovodrun -np N -H localhost:N python -m lab "
    "train ...`"
)


def check_worker() -> None:
    """A Horovod run started by torchrun would train world-size-1 copies under Horovod: refuse it."""
    if torchrun_env.launched_by_torchrun():
        raise LabError(NOT_UNDER_TORCHRUN)


def horovodrun_command(
    nproc_per_node: int, target: list[str], python: str | None = None, timeout_seconds: float = 600
) -> list[str]:
    """argv for horovodrun starting `nproc_per_node` local processes of `target` (["-m", "lab", "train", ...]).

    horovodrun as this Python's module (as torchrun is: the one beside it on PATH may be another Python's), gloo
    as the controller (the wheel is built without MPI), every process on this host. The gloo timeout is the
    lab's collective timeout (dist.timeout_seconds), and so is the start timeout (every process reaching hvd.init):
    Horovod's 30 s default for both is less than a loaded 2-core machine can take to import torch twice."""
    python = python or sys.executable
    seconds = str(max(1, math.ceil(timeout_seconds)))  # horovodrun takes whole seconds
    return [
        python,
        "-m",
        "horovod.runner.launch",
        "-np",
        str(nproc_per_node),
        "-H",
        f"localhost:{nproc_per_node}",
        "--gloo",
        "--gloo-timeout-seconds",
        seconds,
        "--start-timeout",
        seconds,
        python,
        *target,
    ]
