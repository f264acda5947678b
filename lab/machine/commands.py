"""The machine wing's commands, one row each: doctor, validate, accept, gpu-check. Arguments:
lab.machine.health.arguments and lab.machine.devicecheck.arguments; each handler imports what it runs when it is
called. lab.cli joins this table with the other wings' (and keeps `lab bench gpu-check`, the device check's old
name, as an alias that says where it went).
"""

from __future__ import annotations

import argparse

from lab.command import Command
from lab.machine.devicecheck import arguments as devicecheck_arguments
from lab.machine.health import arguments as health_arguments


def doctor(args: argparse.Namespace) -> int:
    from lab.machine.health import doctor as checks

    return checks.run(args.port, args.output_dir, args.expect_gpus, args.min_shm, args.json)


def validate(args: argparse.Namespace) -> int:
    from lab.machine.health import validate as fabric

    return fabric.run(args)


def accept(args: argparse.Namespace) -> int:
    from lab.machine.health import acceptance

    return acceptance.run(args)


def gpu_check(args: argparse.Namespace) -> int:
    from lab.machine.devicecheck import command

    return command.run(args)


GPU_CHECK = Command(
    "gpu-check",
    "every GPU path of the lab on this host, a table last (make gpu-check)",
    devicecheck_arguments.gpu_check_args,
    gpu_check,
)

COMMANDS: tuple[Command, ...] = (
    Command(
        "doctor",
        "preflight checks of this host, one line each; exit 1 when one fails",
        health_arguments.doctor_args,
        doctor,
        description="Check python, torch, devices, NCCL/gloo, /dev/shm, ports, the run output directory and the "
        "interfaces NCCL/GLOO_SOCKET_IFNAME name.",
    ),
    Command(
        "validate",
        "the fabric check's verdict from its facts and all-reduce results: validate.json",
        health_arguments.validate_args,
        validate,
        description="Pick each node's platform from its facts (scripts/node-facts.sh), judge its all-reduce "
        "results (node-NAME.json, nodes.json) at the sizes >= 1 GiB and its facts (PCIe, "
        "InfiniBand, GPUDirect RDMA, DCGM, XIDs, row remaps, the fabric manager) and write "
        "validate.json. Exit 1 when a floor is missed, a check fails or a result is missing.",
    ),
    Command(
        "accept",
        "is this cluster accepted? validate.json, each node's device check and the play's recap: held (accepted) "
        "or failed",
        health_arguments.accept_args,
        accept,
        description="Read RUN_DIR/validate.json (the validate play's or slurm/validate.sbatch's), each GPU node's "
        "device check (RUN_DIR/device-check/NODE.json or NODE/gpu-check.json: make gpu-check's gpu-check.json) "
        "and, with --recap, the play's PLAY RECAP; print the verdict (held: accepted, or failed) with each reason "
        "(docs/acceptance.md). "
        "Exit 1 when the cluster is not accepted.",
    ),
    GPU_CHECK,
)
