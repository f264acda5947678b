"""Packages the lab uses for some commands only, imported where they are used.

Training, the collectives and the device check need only torch, torchvision, PyYAML and numpy (the GPU machines
the lab borrows have little more); figures, the Prometheus exporter, the progress bar and DeepSpeed are imported
by the function that needs them. A command that needs one that is missing says so in one line (exit 2).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from lab.errors import LabError

# module -> its pip name (the one `pip install` takes)
PIP_NAMES = {
    "matplotlib": "matplotlib",
    "prometheus_client": "prometheus_client",
    "tqdm": "tqdm",
    "deepspeed": "deepspeed",
    "pynvml": "nvidia-ml-py",
    "jupyterhub": "jupyterhub",
    "nativeauthenticator": "jupyterhub-nativeauthenticator",
    "jupyterhub_idle_culler": "jupyterhub-idle-culler",
    "dockerspawner": "dockerspawner",
    "batchspawner": "batchspawner",
}


class MissingPackage(LabError):
    """An optional package this command needs is not installed."""


def require(module: str, purpose: str) -> ModuleType:
    """Import `module` (dotted names too), or raise one line naming the package and the pip command.

    >>> require("json", "a test").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if exc.name is None or exc.name.partition(".")[0] != top:
            raise  # the package is there and something it imports is not: its own traceback says what
        pip = PIP_NAMES.get(top, top)
        # the pip command first: callers that keep a line's first 160 characters (gpu-check) keep it
        raise MissingPackage(
            f"the Python package {pip} is not installed (pip install {pip}); {purpose} needs it"
        ) from None
