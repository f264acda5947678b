"""`lab doctor`'s network checks: the ports a run needs free, the interfaces NCCL/GLOO_SOCKET_IFNAME name, and the
address gloo would give the other nodes for this host's name (in a run across hosts, read from the environment)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from lab.errors import LabError
from lab.run.cluster.addresses import is_loopback
from lab.verdict import FAILED, HELD, Check


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


def check_port(port: int) -> Check:
    """Free means a listener could bind it now, on every address (as torchrun's store does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for a listener
        try:
            s.bind(("", port))
        except OSError as exc:
            return Check(
                "port",
                FAILED,
                f"{port} is in use on this host ({exc.strerror})",
                "stop what holds it or choose another port",
            )
    return Check("port", HELD, f"{port} is free")


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
    """This host's network interfaces by name (/sys/class/net where the socket module cannot list them)."""
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []


def check_interfaces(env: Mapping[str, str], names: list[str]) -> list[Check]:
    """Every interface the NCCL/GLOO_SOCKET_IFNAME variables name must exist here (gloo takes exact names)."""
    have = ", ".join(names) or "none"
    checks = [Check("network", HELD, f"interfaces: {have}")]
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl:
        chosen = matching_interfaces(nccl, names)
        checks.append(
            Check("nccl-if", HELD, f"NCCL_SOCKET_IFNAME={nccl} selects {', '.join(chosen)}")
            if chosen
            else Check(
                "nccl-if",
                FAILED,
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
                FAILED,
                f"GLOO_SOCKET_IFNAME={gloo}: no interface {', '.join(missing)} (have: {have})",
                "set it to existing interface names",
            )
            if missing
            else Check("gloo-if", HELD, f"GLOO_SOCKET_IFNAME={gloo} exists")
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
        return Check("hostname", HELD, detail)
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        return Check("hostname", HELD, f"{detail}; gloo binds GLOO_SOCKET_IFNAME={gloo} instead")
    nodes, rdzv_host = run_nodes(env)
    if nodes <= 1 or (rdzv_host is not None and is_loopback(rdzv_host)):
        return Check("hostname", HELD, f"{detail} (loopback: fine while every rank runs on this host)")
    offered = first or "127.0.0.1"
    return Check(
        "hostname",
        FAILED,
        f"{detail} ({'loopback' if first else 'gloo falls back to the loopback address'}) and "
        f"GLOO_SOCKET_IFNAME is unset: in this {nodes}-node run gloo would give {offered} to the other nodes",
        "set GLOO_SOCKET_IFNAME to the cluster interface (lab_env in the inventory), or map the host "
        "name to its cluster address in /etc/hosts",
    )
