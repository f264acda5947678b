"""Which CUDA an NVIDIA driver runs, and which torch from the package index runs on it. Torch-free: `make setup`
reads it before any torch is installed (scripts/torch_for_driver.py), `lab doctor` to name a mismatch.

A driver runs every CUDA of its major version from a minimum on (CUDA's minor-version compatibility; the minimums
from NVIDIA's CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions"): CUDA 13.x needs
580.65.06 or newer, CUDA 12.x 525.60.13 or newer. PyPI's torch wheels carry their CUDA (read from each wheel's
Requires-Dist on the index, 2026-12-06): 2.11 and later need CUDA 13.0 (cuda-toolkit 13.0), 2.7 to 2.10 CUDA 12.6
or 12.8 (nvidia-*-cu12), 2.6 CUDA 12.4. The lab supports torch 2.6 to 2.14: the newest of them for each CUDA major
is in WHEELS.

>>> wheel_for("580.95.05"), wheel_for("550.54.15"), wheel_for("470.256.02")
(('2.14.1', '0.29.1', 13), ('2.10.0', '0.25.0', 12), None)
>>> cuda_major_runs("550.54.15", 13), cuda_major_runs("550.54.15", 12)
(False, True)
"""

from __future__ import annotations

import re

# the oldest driver of each CUDA major version (NVIDIA's release notes, minor-version compatibility)
DRIVER_MINIMUM = {13: (580, 65, 6), 12: (525, 60, 13)}
# the newest torch the lab supports whose wheel on PyPI is built for each CUDA major: (torch, torchvision, CUDA)
WHEELS = (("2.14.1", "0.29.1", 13), ("2.10.0", "0.25.0", 12))


def version(text: str) -> tuple[int, ...]:
    """ "550.54.15" -> (550, 54, 15); () when it holds no number."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def cuda_major_runs(driver: str, major: int) -> bool:
    """Whether this driver runs a build of CUDA `major`.x."""
    minimum = DRIVER_MINIMUM.get(major)
    return minimum is not None and version(driver) >= minimum


def wheel_for(driver: str) -> tuple[str, str, int] | None:
    """The newest supported (torch, torchvision, CUDA major) whose PyPI wheel this driver runs, or None."""
    return next((wheel for wheel in WHEELS if cuda_major_runs(driver, wheel[2])), None)


def minimum_text(major: int) -> str:
    return ".".join(map(str, DRIVER_MINIMUM[major]))
