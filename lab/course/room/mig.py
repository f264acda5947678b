"""MIG slices as a room's seats: which profiles split a GPU evenly, the slices a host lists (`nvidia-smi -L`),
slices planned before they exist and the commands that make them, and the split a room of more learners than GPUs
needs. lab.course.room.plan hands them out; nothing here knows a seat.

>>> planned_slices(2, 2)
('gpu0/mig1', 'gpu0/mig2', 'gpu1/mig1', 'gpu1/mig2')
"""

from __future__ import annotations

import re

# The MIG profiles that split an H100 or H200 into K equal slices: K -> (profile id for `nvidia-smi mig -cgi`, its
# name on an H100 80GB). The ids are the same on an H200, whose slices are larger (1g.18gb ...): `nvidia-smi mig
# -lgip` lists a GPU's own. A slice is one device to CUDA and to NCCL alike, so it is one seat.
MIG_SPLITS = {2: (9, "3g.40gb"), 3: (14, "2g.20gb"), 4: (15, "1g.20gb"), 7: (19, "1g.10gb")}
# A slice planned before it exists (--mig-per-gpu): its GPU and number, in place of the MIG UUID it will have
PLANNED_SLICE = re.compile(r"^gpu(\d+)/mig(\d+)$")
# A MIG instance in `nvidia-smi -L`: "  MIG 2g.20gb     Device  0: (UUID: MIG-4b1d...)"
MIG_LISTED = re.compile(r"^\s+MIG\s.*\(UUID:\s*(MIG-[^)\s]+)\)")


def is_slice(device: str) -> bool:
    """A MIG instance's UUID, or a slice planned before it exists."""
    return device.startswith("MIG-") or bool(PLANNED_SLICE.match(device))


def planned_slices(gpus: int, per_gpu: int) -> tuple[str, ...]:
    """`per_gpu` MIG slices of each GPU, named for the plan until they exist.

    >>> planned_slices(2, 2)
    ('gpu0/mig1', 'gpu0/mig2', 'gpu1/mig1', 'gpu1/mig2')
    """
    return tuple(f"gpu{g}/mig{k}" for g in range(gpus) for k in range(1, per_gpu + 1))


def listed_devices(listing: str) -> tuple[str, ...]:
    """The devices `nvidia-smi -L` lists for seats: each GPU's MIG instances where it has them, else the GPU.

    >>> print(listed_devices(EXAMPLE_LISTING))
    ('MIG-11aa', 'MIG-22bb', '1')
    """
    devices: list[str] = []
    for line in listing.splitlines():
        gpu = re.match(r"^GPU (\d+):", line)
        if gpu:
            devices.append(gpu.group(1))
            continue
        mig = MIG_LISTED.match(line)
        if mig:
            if devices and not devices[-1].startswith("MIG-"):
                devices.pop()  # a GPU in MIG mode is used through its instances only
            devices.append(mig.group(1))
    return tuple(devices)


EXAMPLE_LISTING = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a)
  MIG 3g.40gb     Device  0: (UUID: MIG-11aa)
  MIG 3g.40gb     Device  1: (UUID: MIG-22bb)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1b)
"""


def _host_devices(count: int) -> tuple[str, ...]:
    """This host's GPUs as seats take them: MIG instances where `nvidia-smi -L` lists some, else 0..count-1."""
    import shutil
    import subprocess

    if count and shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            listing = ""
        found = listed_devices(listing)
        if any(d.startswith("MIG-") for d in found):
            return found
    return tuple(str(i) for i in range(count))


def too_many_seats(seats: int, devices: tuple[str, ...]) -> str:
    """Why `seats` cannot each have a device of their own, and the split that would seat them."""
    if any(is_slice(d) for d in devices):
        return (
            f"{seats} seats on {len(devices)} MIG slices: two seats would share a slice (each belongs to one seat); "
            f"at most {len(devices)} seats, or split the GPUs finer (--mig-per-gpu {', '.join(map(str, MIG_SPLITS))})"
        )
    gpus = len(devices)
    split = next((k for k in MIG_SPLITS if k * gpus >= seats), None)
    pairs = -(-seats // 2)  # two learners at one notebook, as the hands-on session is run
    if 2 * pairs <= gpus:
        pairs_say = f"seat them in pairs (--seats {pairs}, 2 GPUs a seat)"
    elif pairs <= gpus:
        pairs_say = f"seat them in pairs (--seats {pairs}, 1 GPU a seat)"
    else:
        pairs_say = "seat fewer"
    if split is None:
        return (
            f"{seats} seats on {gpus} GPUs: at most {max(MIG_SPLITS) * gpus} seats of one MIG slice "
            f"(--mig-per-gpu {max(MIG_SPLITS)}); {pairs_say}"
        )
    return (
        f"{seats} seats on {gpus} GPUs: each GPU belongs to one seat; split each GPU into {split} MIG slices "
        f"(--mig-per-gpu {split}: {split * gpus} slices of {MIG_SPLITS[split][1]} on an H100; "
        f"docs/workshop-reference.md#more-learners-than-gpus-mig-slices), or {pairs_say}"
    )


def mig_commands(devices: tuple[str, ...], seats: int, options: str = "") -> list[str]:
    """How to make the slices a plan of `seats` learners' seats names among the host's `devices` before they exist
    (run on the server as root, its GPUs idle); [] when none is only planned. `options`: the plan's others, to
    plan it again with the slices' UUIDs (" --queue-gpus 4 --instructor-seat")."""
    planned = [m for m in map(PLANNED_SLICE.match, devices) if m]
    if not planned:
        return []
    gpus = sorted({int(m.group(1)) for m in planned})
    per_gpu = len(planned) // len(gpus)
    profile, name = MIG_SPLITS[per_gpu]
    ids = ",".join([str(profile)] * per_gpu)
    gpu_list = ",".join(map(str, gpus))
    return [
        f"sudo nvidia-smi -i {gpu_list} -mig 1   # MIG mode on (with the GPUs idle)",
        f"sudo nvidia-smi mig -i {gpu_list} -cgi {ids} -C   # {per_gpu} x {name} on each (an H100's names)",
        "nvidia-smi -L   # the slices' MIG-... UUIDs",
        f".venv/bin/lab room plan --seats {seats}{options}   # the plan with those UUIDs",
    ]
