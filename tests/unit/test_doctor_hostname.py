"""`lab doctor`'s hostname check: in a run across hosts, a host name that resolves to a loopback address
(Debian's `127.0.1.1 <host>` in /etc/hosts) fails unless GLOO_SOCKET_IFNAME is set.

The resolver is mocked in the first tests because a test cannot change this machine's /etc/hosts; the last
test calls the real `lab doctor` with the real resolver and expects what that resolver says.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys

import pytest

from lab.machine.health import doctor_network
from tests.conftest import ROOT

MULTI_NODE = {"LAB_NNODES": "2", "LAB_RDZV_ENDPOINT": "10.0.0.11:29400"}  # what the preflight role sets


@pytest.fixture
def resolves_to(monkeypatch):
    """Make the host name resolve to the given addresses (a mock: /etc/hosts cannot be changed in a test)."""

    def answer(*addresses: str) -> None:
        monkeypatch.setattr(doctor_network, "resolve_host", lambda name: list(addresses))

    return answer


def test_a_loopback_host_name_fails_a_multi_node_run_with_the_fix(resolves_to):
    resolves_to("127.0.1.1")
    check = doctor_network.check_hostname(MULTI_NODE, hostname="dgx-01")
    assert check.verdict == "failed"
    assert check.line() == (
        "failed  hostname   dgx-01 resolves to 127.0.1.1 (loopback) and GLOO_SOCKET_IFNAME is unset: in this "
        "2-node run gloo would give 127.0.1.1 to the other nodes; set GLOO_SOCKET_IFNAME to the cluster interface "
        "(lab_env in the inventory), or map the host name to its cluster address in /etc/hosts"
    )
    # torchrun's own environment says the same: two worker groups are two nodes
    assert doctor_network.check_hostname({"GROUP_WORLD_SIZE": "2"}, hostname="dgx-01").verdict == "failed"
    # an elastic job that may grow past one node, and an IPv6 loopback
    resolves_to("::1")
    assert doctor_network.check_hostname({**MULTI_NODE, "LAB_NNODES": "1:4"}, hostname="dgx-01").verdict == "failed"


def test_a_name_that_does_not_resolve_fails_too_since_gloo_falls_back_to_loopback(resolves_to):
    resolves_to()
    check = doctor_network.check_hostname(MULTI_NODE, hostname="dgx-01")
    assert (
        check.verdict == "failed"
        and "dgx-01 does not resolve (gloo falls back to the loopback address)" in check.line()
    )


@pytest.mark.parametrize(
    "env",
    [
        {**MULTI_NODE, "GLOO_SOCKET_IFNAME": "bond0"},  # gloo binds that interface instead
        {"LAB_NNODES": "1", "LAB_RDZV_ENDPOINT": "10.0.0.11:29400"},  # one node: loopback is where the ranks are
        {"LAB_NNODES": "2", "LAB_RDZV_ENDPOINT": "127.0.0.1:29400"},  # every "node" on this machine (local.yml)
        {},  # plain `lab doctor`: nothing says multi-node
    ],
)
def test_loopback_is_fine_where_gloo_does_not_offer_it_to_another_host(resolves_to, env):
    resolves_to("127.0.1.1")
    assert doctor_network.check_hostname(env, hostname="dgx-01").verdict == "held"


def test_a_cluster_address_passes(resolves_to):
    resolves_to("192.168.100.11", "127.0.1.1")  # gloo takes the first
    check = doctor_network.check_hostname(MULTI_NODE, hostname="dgx-01")
    assert check.verdict == "held" and check.detail == "dgx-01 resolves to 192.168.100.11, 127.0.1.1"


def test_a_bad_node_count_is_bad_input():
    with pytest.raises(doctor_network.LabError, match=r"^LAB_NNODES: 'two' is not a node count; use N or MIN:MAX"):
        doctor_network.run_nodes({"LAB_NNODES": "two"})


def test_the_real_resolver_through_the_real_command(tmp_path):
    # This machine's own /etc/hosts decides: the doctor must fail exactly when gloo would offer a loopback address.
    addresses = [info[4][0] for info in _getaddrinfo(socket.gethostname())]
    loopback = not addresses or ipaddress.ip_address(addresses[0].split("%")[0]).is_loopback
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"} | MULTI_NODE
    proc = subprocess.run(
        [sys.executable, "-m", "lab", "doctor", "--output-dir", str(tmp_path), "--json", "-"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["hostname"]["verdict"] == ("failed" if loopback else "held"), checks["hostname"]
    assert proc.returncode == (1 if loopback else 0), proc.stderr
    assert checks["hostname"]["detail"].startswith(socket.gethostname())


def _getaddrinfo(name: str) -> list:
    try:
        return socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
