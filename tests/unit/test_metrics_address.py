"""Where a rank's exporter listens, and the address its file_sd entry gives another host's Prometheus."""

from __future__ import annotations

import socket
import urllib.request

import pytest
import torch

from lab.run.config import MetricsConfig
from lab.run.observability import metrics


def _route(address: str | None):
    """A stand-in for the routing table: the node reaches the head from `address`."""
    return lambda head: address


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "10.1.2.3"])
def test_one_node_keeps_the_configured_address(bind):
    listen = metrics.listen_address(bind, multi_node=False, head="127.0.0.1", route=_route("10.9.9.9"))
    assert listen == (bind, "", "")


def test_the_node_address_the_launch_role_passes_is_bound_and_advertised():
    listen = metrics.listen_address(
        "192.168.100.12", multi_node=True, head="192.168.100.11", route=_route("192.168.100.99")
    )
    assert listen == ("192.168.100.12", "", "")  # "" advertises the bind address itself
    assert metrics.listen_address("dgx-02.cluster", multi_node=True, head="dgx-01") == ("dgx-02.cluster", "", "")


def test_default_loopback_on_a_multi_node_run_widens_and_advertises_the_route_to_the_head():
    listen = metrics.listen_address("127.0.0.1", multi_node=True, head="192.168.100.11", route=_route("192.168.100.12"))
    assert (listen.bind, listen.advertise) == ("0.0.0.0", "192.168.100.12")
    assert "cannot be scraped from the other nodes" in listen.reason
    # a head named by host name is another host too (it may resolve to 127.0.1.1 on the head alone)
    assert metrics.listen_address("::1", multi_node=True, head="dgx-01", route=_route("10.0.0.12")).bind == "0.0.0.0"


def test_a_wildcard_on_a_multi_node_run_advertises_the_node_not_its_host_name():
    listen = metrics.listen_address("0.0.0.0", multi_node=True, head="10.0.0.11", route=_route("10.0.0.12"))
    assert listen == ("0.0.0.0", "10.0.0.12", "")


def test_nodes_sharing_one_host_stay_on_loopback():
    # the local two-node inventory: "nodes" 127.0.0.1 and 127.0.0.2, head 127.0.0.1, one port range each
    for bind in ("127.0.0.1", "127.0.0.2"):
        assert metrics.listen_address(bind, multi_node=True, head="127.0.0.1") == (bind, "", "")


def test_no_route_or_only_loopback_falls_back_to_the_host_name():
    for route in (_route(None), _route("127.0.0.1")):
        listen = metrics.listen_address("127.0.0.1", multi_node=True, head="dgx-01", route=route)
        assert listen.advertise == socket.getfqdn()


def test_the_route_to_a_loopback_head_is_loopback_and_an_unusable_address_has_none():
    assert metrics.route_address("127.0.0.1") == "127.0.0.1"
    assert metrics.route_address("fe80::1%no-such-interface") is None  # fails here, without asking DNS


def test_an_exporter_on_a_wildcard_serves_there_and_its_target_names_the_advertised_address():
    labels = {"run_id": "r", "rank": "3", "node": "n"}
    exporter = metrics.RankExporter(0, "0.0.0.0", labels, torch.device("cpu"), {}, advertise="127.0.0.1")
    try:
        assert exporter.server.server_address[0] == "0.0.0.0"
        assert exporter.target() == {"targets": [f"127.0.0.1:{exporter.port}"], "labels": labels}
        assert urllib.request.urlopen(exporter.endpoint, timeout=5).status == 200
    finally:
        exporter.close()


class _Ctx:
    global_rank, local_rank, local_world_size, world_size = 2, 0, 2, 4  # rank 2: the first of the second node
    device = torch.device("cpu")


def test_start_on_a_multi_node_run_leaves_loopback_and_says_why(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "203.0.113.7")  # the head is another host
    monkeypatch.setattr(metrics, "route_address", lambda head: "198.51.100.4")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    said = []
    exporter = metrics.start(MetricsConfig(port_base=port), _Ctx(), "r", {}, say=said.append)
    try:
        assert exporter.server.server_address[0] == "0.0.0.0"
        assert exporter.target() == {
            "targets": [f"198.51.100.4:{port}"],
            "labels": {"run_id": "r", "rank": "2", "node": socket.gethostname()},
        }
    finally:
        exporter.close()
    assert said == [
        "metrics: metrics.bind_address=127.0.0.1 cannot be scraped from the other nodes of this run: "
        "the exporters listen on 0.0.0.0 and advertise 198.51.100.4"
    ]
