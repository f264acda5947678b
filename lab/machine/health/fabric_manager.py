"""Is this an NVSwitch system, and is its fabric manager running? Read from the host's own commands.

On NVSwitch systems (DGX/HGX A100, H100, H200, B200) the GPUs register with the NVLink fabric, which
nvidia-fabricmanager sets up; until they have, CUDA refuses to start with error 802, "system not yet
initialized" (cudaErrorSystemNotReady), and torch sees no GPU. Each GPU's fabric state goes
"Not Started" -> "In Progress" -> "Completed" (`nvidia-smi -q`, section Fabric); GPUs outside a fabric
say "N/A" or "Not Supported". The manager's package must be the driver's exact version (NVIDIA's Fabric
Manager user guide), and from B200 on it needs NVLSM too.

Evidence of NVSwitches, cheapest first: the switches' device files (/dev/nvidia-nvswitch*, absent inside most
containers), then a fabric state other than N/A in `nvidia-smi -q`. The manager's state is
`systemctl is-active nvidia-fabricmanager`'s word, or None where systemd cannot be asked (a container).
`read()` takes the command runner, so tests give it canned outputs. `lab doctor` asks the host now; `lab validate`
reads the same command's output recorded by scripts/node-facts.sh: both read it with `manager_state` and advise
with `start_advice`, so the two say one thing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lab.run.cluster import runner

Runner = Callable[[list[str]], tuple[int, str]]  # argv -> (exit status, stdout and stderr); 127: not installed
SERVICE = "nvidia-fabricmanager"
# systemctl is-active's answers (systemctl(1)); anything else (no systemd: "System has not been booted with
# systemd", "Failed to connect to bus") means the state cannot be read from here.
UNIT_STATES = ("active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance", "unknown")
NO_FABRIC = ("n/a", "not supported")
COMMAND_SECONDS = 20  # nvidia-smi -q on 8 GPUs takes a few seconds; a hung driver must not hang the doctor


@dataclass(frozen=True)
class Fabric:
    nvswitch: str | None  # what shows the switches ("/dev/nvidia-nvswitch0", ...); None: nothing does
    manager: str | None  # systemctl is-active's answer; None: unreadable here
    manager_said: str = ""  # systemctl's own words when unreadable
    driver: str | None = None  # nvidia-smi -q's Driver Version
    states: list[str] = field(default_factory=list)  # each GPU's fabric state, in nvidia-smi's order

    @property
    def manager_down(self) -> bool:
        return self.manager is not None and self.manager != "active"


def run_command(argv: list[str]) -> tuple[int, str]:
    """`argv`'s exit status and output (stdout, then stderr); 127 when it is not installed, 124 past its time."""
    if shutil.which(argv[0]) is None:
        return 127, f"{argv[0]}: command not found"
    done = runner.run(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout_seconds=COMMAND_SECONDS, echo=False
    )
    return (124 if done.timed_out else done.returncode), done.stdout


def fabric_states(smi_q: str) -> list[str]:
    """Each GPU's fabric state from `nvidia-smi -q`: the "State" line under each "Fabric" heading.

    >>> fabric_states("GPU 0\\n    Fabric\\n        State : In Progress\\n        Status : N/A\\n")
    ['In Progress']
    """
    states, in_fabric = [], False
    for line in smi_q.splitlines():
        key, colon, value = (part.strip() for part in line.partition(":"))
        if key == "Fabric" and not colon:  # the section's heading
            in_fabric = True
        elif in_fabric and key == "State":
            states.append(value)
            in_fabric = False
    return states


def driver_version(smi_q: str) -> str | None:
    found = re.search(r"^Driver Version\s*:\s*(\S+)", smi_q, re.MULTILINE)
    return found.group(1) if found else None


def manager_state(said: str) -> str | None:
    """`systemctl is-active`'s word in its output, or None where the output is not one (no systemd here).

    >>> manager_state("inactive\\n"), manager_state("System has not been booted with systemd as init system")
    ('inactive', None)
    """
    word = said.strip().splitlines()[0].strip() if said.strip() else ""
    return word if word in UNIT_STATES else None


def start_advice(driver: str | None) -> str:
    """What to do when the manager is not active."""
    shown = driver or "nvidia-smi shows it"
    return (
        f"sudo systemctl start {SERVICE} (its package must be the driver's version, {shown}; B200 and later "
        f"also need NVLSM), then check that `nvidia-smi -q | grep -A 2 Fabric` says State: Completed"
    )


def read(run: Runner = run_command, dev: Path = Path("/dev")) -> Fabric:
    """This host's switches and fabric manager, from its device files, `nvidia-smi -q` and systemctl."""
    switches = sorted(p.name for p in dev.glob("nvidia-nvswitch[0-9]*"))
    code, smi_q = run(["nvidia-smi", "-q"])
    smi_q = smi_q if code == 0 else ""
    states = fabric_states(smi_q)
    in_fabric = [s for s in states if s.lower() not in NO_FABRIC]
    nvswitch = (
        f"{dev}/{switches[0]} exists"
        if switches
        else f"nvidia-smi -q: fabric state {in_fabric[0]}"
        if in_fabric
        else None
    )
    _, said = run(["systemctl", "is-active", SERVICE])
    manager = manager_state(said)
    return Fabric(nvswitch, manager, "" if manager else said.strip()[:120], driver_version(smi_q), states)
