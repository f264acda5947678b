"""`lab doctor`: is this host ready for a (multi-node) run? One line per check.

    $ lab doctor --port 29400 --output-dir runs
    held    python     3.11.7 (.venv/bin/python)
    held    torch      2.14.1 (CUDA build 12.8)
    held    devices    no CUDA GPU; 2 CPU cores (gloo on the CPU)
    ...
    failed  port       29400 is in use on this host; stop what holds it or choose another port

Each line's first word is its verdict (lab.verdict: held, failed, not applicable); a check that held with something
to fix says it after a semicolon (a small /dev/shm). Exit 0 when no check failed, 1 when one did. `--json PATH`
(`-` for stdout, the lines then go to stderr) writes the checks and the facts they
found (GPU count and names, versions, /dev/shm size, interfaces): the Ansible
preflight role runs this on every node and reads that file. torch is imported
inside the checks, so a host without it gets a failed check, not a traceback.

The checks by what they ask: lab.machine.health.doctor_torch (torch, its devices, NCCL, gloo), doctor_network (the
ports, the interfaces, the address this host's name gives gloo) and doctor_slurm (the allocation); the host's own
(a compiler for torch.compile, /dev/shm, the output folder) are here, with the command.

Checks that only matter across hosts read the run's shape from the environment:
LAB_NNODES (N or MIN:MAX) and LAB_RDZV_ENDPOINT (HOST:PORT), which the preflight
role sets, else torchrun's GROUP_WORLD_SIZE (the nodes of the worker group):

    $ LAB_NNODES=2 LAB_RDZV_ENDPOINT=10.0.0.11:29400 lab doctor
    failed  hostname   dgx-01 resolves to 127.0.1.1 (loopback) and GLOO_SOCKET_IFNAME is unset: ...

Inside a Slurm job (SLURM_JOB_ID set) two more lines, `slurm` (the allocation as this task sees it) and
`gpu-share` (fails when this task must see a GPU that another task of its step on this node sees too), and the
JSON's "slurm" key holds the allocation's facts (null outside Slurm):

    $ srun -N2 --ntasks-per-node=8 --gres=gpu:8 lab doctor
    held    slurm      job 4242 on dgx: 2 node(s) dgx01,dgx02; this is dgx01 (node 0), step task 3 of 16, 8 on ...
    failed  gpu-share  8 tasks of this step on dgx01 each see 8 GPU(s) (CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7) ...
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.machine.health.doctor_network import check_hostname, check_interfaces, check_port, interfaces, parse_ports
from lab.machine.health.doctor_slurm import check_slurm_job, node_gpu_count
from lab.machine.health.doctor_torch import check_torch
from lab.run.cluster import slurm
from lab.verdict import FAILED, HELD, Check

GIB = 1024**3
DEFAULT_MIN_SHM_BYTES = 1 * GIB  # NCCL and DataLoader workers use /dev/shm; Docker's default is 64 MiB


def check_shm(min_bytes: int, path: str = "/dev/shm") -> tuple[Check, int | None]:
    """(the check, the size in bytes): a small /dev/shm holds, with the fix to make."""
    try:
        st = os.statvfs(path)
    except OSError:
        return Check("shm", HELD, f"{path} is missing", "NCCL and data workers need shared memory"), None
    size = st.f_blocks * st.f_frsize
    detail = f"{path} is {size / GIB:.1f} GiB"
    if size < min_bytes:
        return Check(
            "shm",
            HELD,
            f"{detail}, below {min_bytes / GIB:.1f} GiB",
            "run containers with --ipc host (or --shm-size 16g); NCCL and data workers need it",
        ), size
    return Check("shm", HELD, detail), size


def check_output_dir(path: str) -> Check:
    """Writable if it exists and is writable, or its nearest existing parent is (the run will create it)."""
    target = Path(path).absolute()
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return Check("output", HELD, f"{target} is writable" + ("" if existing == target else " (will be created)"))
    return Check(
        "output",
        FAILED,
        f"{target} is not writable (checked {existing})",
        "choose a writable run.output_dir or fix its permissions",
    )


def c_compiler(env: Mapping[str, str]) -> str | None:
    """The C compiler Triton would use: $CC when set and found, else cc or gcc on PATH."""
    path = env.get("PATH", "")
    names = [env["CC"].split()[0]] if env.get("CC", "").split() else ["cc", "gcc"]
    return next((found for name in names if (found := shutil.which(name, path=path))), None)


def check_compile(env: Mapping[str, str], include_dir: str | None = None) -> Check:
    """Can torch.compile (model.compile: true) work here? Inductor's Triton kernels are built at run time
    with a C compiler against Python.h; without either the first compiled step fails, not this check."""
    include = Path(include_dir or sysconfig.get_paths()["include"])
    compiler = c_compiler(env)
    missing = ([] if compiler else ["a C compiler (cc/gcc on PATH or $CC)"]) + (
        [] if (include / "Python.h").is_file() else [f"Python.h (not in {include})"]
    )
    if not missing:
        return Check("compile", HELD, f"torch.compile can build kernels: {compiler}, {include / 'Python.h'}")
    dev = f"python{sys.version_info.major}.{sys.version_info.minor}-dev"
    return Check(
        "compile",
        HELD,
        f"torch.compile (model.compile) cannot build kernels: no {' and no '.join(missing)}",
        f"on Debian/Ubuntu or in an NGC container: apt-get install -y gcc {dev}",
    )


def run_checks(
    ports: list[int],
    output_dir: str,
    expect_gpus: int | None = None,
    min_shm_bytes: int = DEFAULT_MIN_SHM_BYTES,
    env: Mapping[str, str] | None = None,
) -> tuple[list[Check], dict[str, Any]]:
    """Every check in the order it prints, and the facts the JSON keeps."""
    env = os.environ if env is None else env
    checks = [Check("python", HELD, f"{platform.python_version()} ({sys.executable})")]
    torch_checks, facts = check_torch(expect_gpus)
    checks += torch_checks
    checks.append(check_compile(env))
    shm, facts["shm_bytes"] = check_shm(min_shm_bytes)
    checks.append(shm)
    checks += [check_port(p) for p in ports]
    checks.append(check_output_dir(output_dir))
    facts["interfaces"] = interfaces()
    checks += check_interfaces(env, facts["interfaces"])
    checks.append(check_hostname(env))
    job, visible = slurm.allocation(env), env.get("CUDA_VISIBLE_DEVICES")
    node_gpus = node_gpu_count(visible, facts.get("gpu_count", 0)) if job is not None else None  # NVML: Slurm only
    slurm_checks, facts["slurm"] = check_slurm_job(job, visible, node_gpus)
    checks += slurm_checks
    facts.update(host=socket.gethostname(), python=platform.python_version())
    return checks, facts


def run(ports: list[str], output_dir: str, expect_gpus: int | None, min_shm_gib: float, json_path: str | None) -> int:
    """Print one line per check (to stderr when the JSON goes to stdout); 0 if none failed, else 1."""
    if expect_gpus is not None and expect_gpus < 0:
        raise LabError(f"--expect-gpus: {expect_gpus}; use 0 or more")
    checks, facts = run_checks(parse_ports(ports), output_dir, expect_gpus, int(min_shm_gib * GIB))
    failed = [c for c in checks if not c.passes]
    out = sys.stderr if json_path == "-" else sys.stdout
    for c in checks:
        print(c.line(), file=out)
    advised = sum(c.passes and bool(c.fix) for c in checks)
    print(
        f"doctor: {len(failed)} of {len(checks)} checks failed, {advised} held with a fix to make"
        if failed
        else f"doctor: {len(checks)} checks held or did not apply, {advised} with a fix to make",
        file=out,
        flush=True,
    )
    if json_path:
        doc = json.dumps(
            {
                "ok": not failed,
                "verdict": FAILED if failed else HELD,
                "host": facts["host"],
                "slurm": facts["slurm"],
                "checks": [{**c.record(), "line": c.line()} for c in checks],
                "facts": facts,
            },
            indent=2,
            sort_keys=True,
        )
        if json_path == "-":
            print(doc, flush=True)
        else:
            Path(json_path).write_text(doc + "\n")
    return 1 if failed else 0
