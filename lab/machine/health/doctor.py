"""`lab doctor`: is this host ready for a (multi-node) run? One line per check.

    $ lab doctor --port 29400 --output-dir runs
    ok    python     3.11.7 (.venv/bin/python)
    ok    torch      2.14.1 (CUDA build 12.8)
    ok    devices    no CUDA GPU; 2 CPU cores (gloo on the CPU)
    ...
    fail  port       29400 is in use on this host; stop what holds it or choose another port

Exit 0 when no check failed (warnings are allowed), 1 when one did. `--json PATH`
(`-` for stdout, the lines then go to stderr) writes the checks and the facts they
found (GPU count and names, versions, /dev/shm size, interfaces): the Ansible
preflight role runs this on every node and reads that file. torch is imported
inside the checks, so a host without it gets a failed check, not a traceback.

Checks that only matter across hosts read the run's shape from the environment:
LAB_NNODES (N or MIN:MAX) and LAB_RDZV_ENDPOINT (HOST:PORT), which the preflight
role sets, else torchrun's GROUP_WORLD_SIZE (the nodes of the worker group):

    $ LAB_NNODES=2 LAB_RDZV_ENDPOINT=10.0.0.11:29400 lab doctor
    fail  hostname   dgx-01 resolves to 127.0.1.1 (loopback) and GLOO_SOCKET_IFNAME is unset: ...

Inside a Slurm job (SLURM_JOB_ID set) two more lines, `slurm` (the allocation as this task sees it) and
`gpu-share` (fails when this task must see a GPU that another task of its step on this node sees too), and the
JSON's "slurm" key holds the allocation's facts (null outside Slurm):

    $ srun -N2 --ntasks-per-node=8 --gres=gpu:8 lab doctor
    ok    slurm      job 4242 on dgx: 2 node(s) dgx01,dgx02; this is dgx01 (node 0), step task 3 of 16, 8 on ...
    fail  gpu-share  8 tasks of this step on dgx01 each see 8 GPU(s) (CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7) ...
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import sys
import sysconfig
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lab.errors import LabError
from lab.machine.health import fabric_manager
from lab.machine.health.check import Check
from lab.machine.health.doctor_slurm import check_slurm_job, node_gpu_count
from lab.machine.health.status import FAIL, OK, WARN
from lab.run.cluster import cores, nvml, slurm
from lab.run.cluster.addresses import is_loopback

GIB = 1024**3
DEFAULT_MIN_SHM_BYTES = 1 * GIB  # NCCL and DataLoader workers use /dev/shm; Docker's default is 64 MiB


def parse_ports(specs: list[str]) -> list[int]:
    """Ports from `--port` values: one port, or FIRST-LAST.

    >>> parse_ports(["29400", "9500-9502"])
    [29400, 9500, 9501, 9502]
    """
    ports: list[int] = []
    for spec in specs:
        first, _, last = spec.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise LabError(f"--port: {spec!r} is not a port; use PORT or FIRST-LAST, e.g. 29400 or 9500-9507")
        lo, hi = int(first), int(last or first)
        if not 0 < lo <= hi < 65536:
            raise LabError(f"--port: {spec!r} is out of range; ports are 1..65535, FIRST <= LAST")
        ports += range(lo, hi + 1)
    return ports


def matching_interfaces(spec: str, names: list[str]) -> list[str]:
    """The interfaces an NCCL_SOCKET_IFNAME value selects: comma-separated prefixes, `=` for an
    exact name, a leading `^` to exclude instead of include (NCCL's rules).

    >>> matching_interfaces("eth", ["lo", "eth0", "eth1"])
    ['eth0', 'eth1']
    >>> matching_interfaces("=eth", ["eth0"])
    []
    >>> matching_interfaces("^lo,docker", ["lo", "eth0", "docker0"])
    ['eth0']
    """
    exclude = spec.startswith("^")
    patterns = [p for p in spec.lstrip("^").split(",") if p]

    def hit(name: str) -> bool:
        return any(name == p[1:] if p.startswith("=") else name.startswith(p) for p in patterns)

    return [n for n in names if hit(n) != exclude]


def interfaces() -> list[str]:
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []


def check_interfaces(env: Mapping[str, str], names: list[str]) -> list[Check]:
    """Every interface the NCCL/GLOO_SOCKET_IFNAME variables name must exist here (gloo takes exact names)."""
    have = ", ".join(names) or "none"
    checks = [Check("network", OK, f"interfaces: {have}")]
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl:
        chosen = matching_interfaces(nccl, names)
        checks.append(
            Check("nccl-if", OK, f"NCCL_SOCKET_IFNAME={nccl} selects {', '.join(chosen)}")
            if chosen
            else Check(
                "nccl-if",
                FAIL,
                f"NCCL_SOCKET_IFNAME={nccl} selects no interface (have: {have})",
                "set it to this host's cluster interface",
            )
        )
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        missing = [n for n in gloo.split(",") if n and n not in names]
        checks.append(
            Check(
                "gloo-if",
                FAIL,
                f"GLOO_SOCKET_IFNAME={gloo}: no interface {', '.join(missing)} (have: {have})",
                "set it to existing interface names",
            )
            if missing
            else Check("gloo-if", OK, f"GLOO_SOCKET_IFNAME={gloo} exists")
        )
    return checks


def resolve_host(name: str) -> list[str]:
    """The addresses `name` resolves to, in the resolver's order (/etc/hosts first on most hosts); [] if none."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:  # socket.gaierror: the name does not resolve
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def run_nodes(env: Mapping[str, str]) -> tuple[int, str | None]:
    """(the most nodes the run may have, the rendezvous host when known) from LAB_NNODES and LAB_RDZV_ENDPOINT
    (the preflight role's) or torchrun's GROUP_WORLD_SIZE; (1, None) outside both.

    >>> run_nodes({"LAB_NNODES": "1:4", "LAB_RDZV_ENDPOINT": "[::1]:29400"})
    (4, '::1')
    >>> run_nodes({"GROUP_WORLD_SIZE": "2"})
    (2, None)
    """
    name = "LAB_NNODES" if env.get("LAB_NNODES") else "GROUP_WORLD_SIZE"
    spec = env.get(name) or "1"
    counts = spec.split(":")
    if len(counts) > 2 or not all(c.isdigit() and int(c) > 0 for c in counts):
        raise LabError(f"{name}: {spec!r} is not a node count; use N or MIN:MAX, e.g. 2 or 1:4")
    endpoint = env.get("LAB_RDZV_ENDPOINT", "")
    host = endpoint.rpartition(":")[0].strip("[]") if ":" in endpoint else endpoint
    return int(counts[-1]), host or None


def check_hostname(env: Mapping[str, str], hostname: str | None = None) -> Check:
    """gloo without GLOO_SOCKET_IFNAME binds to the first address this host's name resolves to and gives it to
    the other ranks. Debian's `127.0.1.1 <host name>` line in /etc/hosts makes that a loopback address, so a
    rank on another node connects to itself and the gloo group hangs until its timeout; a name that does not
    resolve falls back to the loopback address too. Fatal only in a run across hosts: a rendezvous on a
    loopback address means every node is this machine (the local two-node inventory)."""
    hostname = hostname or socket.gethostname()
    addresses = resolve_host(hostname)
    first = addresses[0] if addresses else None
    detail = f"{hostname} resolves to {', '.join(addresses)}" if addresses else f"{hostname} does not resolve"
    if first is not None and not is_loopback(first):
        return Check("hostname", OK, detail)
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        return Check("hostname", OK, f"{detail}; gloo binds GLOO_SOCKET_IFNAME={gloo} instead")
    nodes, rdzv_host = run_nodes(env)
    if nodes <= 1 or (rdzv_host is not None and is_loopback(rdzv_host)):
        return Check("hostname", OK, f"{detail} (loopback: fine while every rank runs on this host)")
    offered = first or "127.0.0.1"
    return Check(
        "hostname",
        FAIL,
        f"{detail} ({'loopback' if first else 'gloo falls back to the loopback address'}) and "
        f"GLOO_SOCKET_IFNAME is unset: in this {nodes}-node run gloo would give {offered} to the other nodes",
        "set GLOO_SOCKET_IFNAME to the cluster interface (lab_env in the inventory), or map the host "
        "name to its cluster address in /etc/hosts",
    )


def check_shm(min_bytes: int, path: str = "/dev/shm") -> tuple[Check, int | None]:
    try:
        st = os.statvfs(path)
    except OSError:
        return Check("shm", WARN, f"{path} is missing", "NCCL and data workers need shared memory"), None
    size = st.f_blocks * st.f_frsize
    detail = f"{path} is {size / GIB:.1f} GiB"
    if size < min_bytes:
        return Check(
            "shm",
            WARN,
            f"{detail}, below {min_bytes / GIB:.1f} GiB",
            "run containers with --ipc host (or --shm-size 16g); NCCL and data workers need it",
        ), size
    return Check("shm", OK, detail), size


def check_port(port: int) -> Check:
    """Free means a listener could bind it now, on every address (as torchrun's store does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for a listener
        try:
            s.bind(("", port))
        except OSError as exc:
            return Check(
                "port",
                FAIL,
                f"{port} is in use on this host ({exc.strerror})",
                "stop what holds it or choose another port",
            )
    return Check("port", OK, f"{port} is free")


def check_output_dir(path: str) -> Check:
    """Writable if it exists and is writable, or its nearest existing parent is (the run will create it)."""
    target = Path(path).absolute()
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return Check("output", OK, f"{target} is writable" + ("" if existing == target else " (will be created)"))
    return Check(
        "output",
        FAIL,
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
        return Check("compile", OK, f"torch.compile can build kernels: {compiler}, {include / 'Python.h'}")
    dev = f"python{sys.version_info.major}.{sys.version_info.minor}-dev"
    return Check(
        "compile",
        WARN,
        f"torch.compile (model.compile) cannot build kernels: no {' and no '.join(missing)}",
        f"on Debian/Ubuntu or in an NGC container: apt-get install -y gcc {dev}",
    )


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
            FAIL,
            "NVIDIA devices are present but this torch is a CPU build",
            "install a CUDA build of torch that matches the driver (or use the lab image)",
        ), {}
    fabric = read_fabric()
    facts = {"cuda_error": init_error, "fabric": asdict(fabric)}
    said = f"torch (CUDA build {cuda_build}) cannot start CUDA: {init_error or 'no error given'}"
    driver = fabric.driver or nvml.driver_version()
    start = fabric_manager.start_advice(driver)
    # Error 802 (cudaErrorSystemNotReady) is the fabric's: it names the manager even where no switch is seen.
    not_ready = bool(re.search(r"\b802\b|not yet initialized", init_error))
    where = f"this is an NVSwitch system ({fabric.nvswitch})" if fabric.nvswitch else "error 802 is the fabric's"
    if fabric.manager_down and (fabric.nvswitch or not_ready):
        return Check(
            "devices",
            FAIL,
            f"{said}; {where} and {fabric_manager.SERVICE} is {fabric.manager}: the GPUs cannot join the NVLink fabric",
            start,
        ), facts
    if (fabric.nvswitch or not_ready) and fabric.manager is None:
        return Check(
            "devices",
            FAIL,
            f"{said}; {where}, and the fabric manager's state cannot be read here "
            f"(systemctl: {fabric.manager_said or 'no answer'})",
            f"on the host (not in a container): systemctl status {fabric_manager.SERVICE}; if it is not "
            f"active, {start}",
        ), facts
    return Check(
        "devices",
        FAIL,
        said,
        "check nvidia-smi; a driver older than torch's CUDA build needs a newer "
        "driver or a torch built for the driver's CUDA; a container needs --gpus all",
    ), facts


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
        return [Check("torch", FAIL, f"cannot import torch ({exc})", "install the lab: pip install -e .")], {}
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
            OK,
            f"{torch.__version__} ({'CUDA build ' + torch.version.cuda if torch.version.cuda else 'CPU build'})",
        )
    ]
    if torch.cuda.is_available():
        facts["gpu_count"] = torch.cuda.device_count()
        facts["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(facts["gpu_count"])]
        names = sorted(set(facts["gpu_names"]))
        checks.append(Check("devices", OK, f"{facts['gpu_count']} x {', '.join(names)}"))
    elif nvml.host_has_gpus():
        unusable, found = check_unusable_gpus(
            torch.version.cuda, cuda_init_error(torch) if torch.version.cuda else "", read_fabric
        )
        checks.append(unusable)
        facts.update(found)
    else:
        checks.append(Check("devices", OK, f"no CUDA GPU; {cores.available()} CPU cores (gloo on the CPU)"))
    if expect_gpus is not None and facts["gpu_count"] != expect_gpus:
        checks.append(
            Check(
                "devices",
                FAIL,
                f"{facts['gpu_count']} GPUs, expected {expect_gpus}",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES, or change the expected count",
            )
        )
    if facts["gpu_count"]:
        facts["driver"] = nvml.driver_version()
        checks.append(Check("driver", OK, facts["driver"] or "not read (install nvidia-ml-py to read it)"))
        if dist.is_nccl_available():
            facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            checks.append(Check("nccl", OK, facts["nccl"]))
        else:
            checks.append(Check("nccl", FAIL, "torch has no NCCL", "use a CUDA build of torch with NCCL"))
    checks.append(
        Check("gloo", OK, "available")
        if dist.is_gloo_available()
        else Check("gloo", FAIL, "torch has no gloo backend", "install a standard torch build")
    )
    return checks, facts


def run_checks(
    ports: list[int],
    output_dir: str,
    expect_gpus: int | None = None,
    min_shm_bytes: int = DEFAULT_MIN_SHM_BYTES,
    env: Mapping[str, str] | None = None,
) -> tuple[list[Check], dict[str, Any]]:
    env = os.environ if env is None else env
    checks = [Check("python", OK, f"{platform.python_version()} ({sys.executable})")]
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
    failed = [c for c in checks if c.status == FAIL]
    out = sys.stderr if json_path == "-" else sys.stdout
    for c in checks:
        print(c.line(), file=out)
    warned = sum(c.status == WARN for c in checks)
    print(
        f"doctor: {len(failed)} of {len(checks)} checks failed, {warned} warned"
        if failed
        else f"doctor: {len(checks)} checks passed, {warned} warned",
        file=out,
        flush=True,
    )
    if json_path:
        doc = json.dumps(
            {
                "ok": not failed,
                "host": facts["host"],
                "slurm": facts["slurm"],
                "checks": [{**asdict(c), "line": c.line()} for c in checks],
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
