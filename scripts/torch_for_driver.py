#!/usr/bin/env python3
"""`make setup`'s constraints for this host: constraints.txt as it is, or with the torch this host's NVIDIA driver
runs (lab/machine/health/driver.py: PyPI's torch 2.14.1 is built for CUDA 13.0, which needs driver 580 or newer;
the newest supported torch built for CUDA 12 is 2.10.0).

    python3 scripts/torch_for_driver.py constraints.txt > .venv/constraints.txt

No nvidia-smi (a CPU host), or a driver that runs the pinned torch: the constraints unchanged, nothing said. An
older driver that runs a CUDA 12 wheel: torch and torchvision pinned to that wheel, one line on stderr saying so.
A driver older than any supported wheel needs: one line on stderr naming what to do, exit 2. Runs with the
system's python3, before any venv or torch exists (the driver table is torch-free).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.machine.health import driver  # after the checkout is on the path


def driver_version() -> str | None:
    """The first GPU's driver version as nvidia-smi reports it, None where there is no nvidia-smi or it fails."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[0] if done.returncode == 0 and lines else None


def pinned(constraints: str, name: str) -> str | None:
    match = re.search(rf"^{name}==(\S+)", constraints, re.M)
    return match.group(1) if match else None


def main(argv: list[str]) -> int:
    text = Path(argv[0]).read_text()
    found = driver_version()
    torch_pin = pinned(text, "torch")
    wheel = driver.wheel_for(found) if found else None
    if found is None:  # no NVIDIA driver here: the pinned torch (a CPU host runs PyPI's CUDA build on the CPU)
        sys.stdout.write(text)
        return 0
    if wheel is None:
        oldest = driver.minimum_text(12)
        print(
            f"make setup: NVIDIA driver {found} runs no torch wheel the lab supports (CUDA 12 wheels need {oldest} or "
            f"newer, torch {torch_pin}'s CUDA 13 needs {driver.minimum_text(13)}): upgrade the driver, or use the "
            "lab image, whose NGC base matches its driver (docs/containers.md)",
            file=sys.stderr,
        )
        return 2
    torch_version, torchvision_version, cuda = wheel
    if torch_version == torch_pin:
        sys.stdout.write(text)
        return 0
    print(
        f"make setup: NVIDIA driver {found} runs CUDA {cuda} wheels, not torch {torch_pin}'s CUDA 13 (driver "
        f"{driver.minimum_text(13)} or newer): installing torch {torch_version} and torchvision {torchvision_version} "
        "instead (README: which torch a driver gets)",
        file=sys.stderr,
    )
    text = re.sub(r"^torch==\S+", f"torch=={torch_version}", text, flags=re.M)
    text = re.sub(r"^torchvision==\S+", f"torchvision=={torchvision_version}", text, flags=re.M)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
