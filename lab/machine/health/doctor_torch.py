"""`lab doctor`'s torch checks: torch itself, the devices it sees (or why it cannot use the host's NVIDIA GPUs: a CPU
build, CUDA's own error, the fabric manager down), the driver, NCCL and gloo. torch is imported inside check_torch,
so a host without it gets a failed check, not a traceback."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from lab.machine.health import driver, fabric_manager
from lab.run.cluster import cores, nvml
from lab.verdict import FAILED, HELD, Check


def cuda_init_error(torch: Any) -> str:
    """Why CUDA does not start, in CUDA's words ("CUDA error 802: system not yet initialized"), or torch's first
    line; "" when torch.cuda.init() raises nothing."""
    try:
        with warnings.catch_warnings():  # is_available() has warned once already
            warnings.simplefilter("ignore")
            torch.cuda.init()
    except Exception as exc:
        text = str(exc)
        found = re.search(r"Error (\d+): ([^(\n]+)", text)
        return f"CUDA error {found.group(1)}: {found.group(2).strip()}" if found else text.strip().split("\n")[0][:200]
    return ""


def check_unusable_gpus(
    cuda_build: str | None, init_error: str, read_fabric: Callable[[], fabric_manager.Fabric]
) -> tuple[Check, dict[str, Any]]:
    """NVIDIA GPUs are here and torch cannot use them: say why. A CPU build of torch needs a CUDA build; a CUDA
    build that cannot start CUDA on an NVSwitch system whose fabric manager is down needs the manager started
    (installing torch again would change nothing); anything else is CUDA's own error with the usual causes."""
    if cuda_build is None:
        return Check(
            "devices",
            FAILED,
            "NVIDIA devices are present but this torch is a CPU build",
            "install a CUDA build of torch that matches the driver (or use the lab image)",
        ), {}
    fabric = read_fabric()
    facts = {"cuda_error": init_error, "fabric": asdict(fabric)}
    said = f"torch (CUDA build {cuda_build}) cannot start CUDA: {init_error or 'no error given'}"
    found_driver = fabric.driver or nvml.driver_version()
    start = fabric_manager.start_advice(found_driver)
    # Error 802 (cudaErrorSystemNotReady) is the fabric's: it names the manager even where no switch is seen.
    not_ready = bool(re.search(r"\b802\b|not yet initialized", init_error))
    where = f"this is an NVSwitch system ({fabric.nvswitch})" if fabric.nvswitch else "error 802 is the fabric's"
    if fabric.manager_down and (fabric.nvswitch or not_ready):
        return Check(
            "devices",
            FAILED,
            f"{said}; {where} and {fabric_manager.SERVICE} is {fabric.manager}: the GPUs cannot join the NVLink fabric",
            start,
        ), facts
    if (fabric.nvswitch or not_ready) and fabric.manager is None:
        return Check(
            "devices",
            FAILED,
            f"{said}; {where}, and the fabric manager's state cannot be read here "
            f"(systemctl: {fabric.manager_said or 'no answer'})",
            f"on the host (not in a container): systemctl status {fabric_manager.SERVICE}; if it is not "
            f"active, {start}",
        ), facts
    mismatch = driver_mismatch(cuda_build, found_driver)
    if mismatch:
        return Check("devices", FAILED, f"{said}; {mismatch[0]}", mismatch[1]), facts
    return Check(
        "devices",
        FAILED,
        said,
        "check nvidia-smi; a driver older than torch's CUDA build needs a newer "
        "driver or a torch built for the driver's CUDA; a container needs --gpus all",
    ), facts


def driver_mismatch(cuda_build: str, driver_version: str | None) -> tuple[str, str] | None:
    """(what is wrong, what to do) when this driver is older than torch's CUDA build needs, else None.

    >>> driver_mismatch("13.0", "550.54.15")[0]
    'driver 550.54.15 is older than CUDA 13.0 needs (580.65.6 or newer)'
    >>> driver_mismatch("13.0", "580.95.05"), driver_mismatch("12.8", "550.54.15"), driver_mismatch("13.0", None)
    (None, None, None)
    """
    major = driver.version(cuda_build)[:1]
    if not driver_version or not major or major[0] not in driver.DRIVER_MINIMUM:
        return None
    if driver.cuda_major_runs(driver_version, major[0]):
        return None
    wheel = driver.wheel_for(driver_version)
    fix = (
        f"install torch {wheel[0]} (built for CUDA {wheel[2]}, which this driver runs; make setup picks it), "
        f"or upgrade the driver"
        if wheel
        else "upgrade the driver, or use the lab image (its NGC base matches its driver)"
    )
    return (
        f"driver {driver_version} is older than CUDA {cuda_build} needs ({driver.minimum_text(major[0])} or newer)",
        fix,
    )


def check_torch(
    expect_gpus: int | None,
    read_fabric: Callable[[], fabric_manager.Fabric] = fabric_manager.read,
) -> tuple[list[Check], dict[str, Any]]:
    """torch, its devices and its collective backends. `read_fabric`: the NVSwitch and fabric-manager facts,
    read only when GPUs are present that torch cannot use."""
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:
        return [Check("torch", FAILED, f"cannot import torch ({exc})", "install the lab: pip install -e .")], {}
    facts: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu_count": 0,
        "gpu_names": [],
        "nccl": None,
        "driver": None,
    }
    checks = [
        Check(
            "torch",
            HELD,
            f"{torch.__version__} ({'CUDA build ' + torch.version.cuda if torch.version.cuda else 'CPU build'})",
        )
    ]
    if torch.cuda.is_available():
        facts["gpu_count"] = torch.cuda.device_count()
        facts["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(facts["gpu_count"])]
        names = sorted(set(facts["gpu_names"]))
        checks.append(Check("devices", HELD, f"{facts['gpu_count']} x {', '.join(names)}"))
    elif nvml.host_has_gpus():
        unusable, found = check_unusable_gpus(
            torch.version.cuda, cuda_init_error(torch) if torch.version.cuda else "", read_fabric
        )
        checks.append(unusable)
        facts.update(found)
    else:
        checks.append(Check("devices", HELD, f"no CUDA GPU; {cores.available()} CPU cores (gloo on the CPU)"))
    if expect_gpus is not None and facts["gpu_count"] != expect_gpus:
        checks.append(
            Check(
                "devices",
                FAILED,
                f"{facts['gpu_count']} GPUs, expected {expect_gpus}",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES, or change the expected count",
            )
        )
    if facts["gpu_count"]:
        facts["driver"] = nvml.driver_version()
        checks.append(Check("driver", HELD, facts["driver"] or "not read (install nvidia-ml-py to read it)"))
        if dist.is_nccl_available():
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            checks.append(Check("nccl", HELD, facts["nccl"]))
        else:
            checks.append(Check("nccl", FAILED, "torch has no NCCL", "use a CUDA build of torch with NCCL"))
    checks.append(
        Check("gloo", HELD, "available")
        if dist.is_gloo_available()
        else Check("gloo", FAILED, "torch has no gloo backend", "install a standard torch build")
    )
    return checks, facts
