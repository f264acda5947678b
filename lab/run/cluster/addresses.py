"""What kind of network address a string names: the doctor's host-name check and the exporters'
listen address both ask whether an address only reaches this host.

>>> [is_loopback(a) for a in ("127.0.1.1", "::1", "localhost", "fe80::1%eth0", "10.0.0.11", "dgx-01")]
[True, True, True, False, False, False]
>>> [is_wildcard(a) for a in ("0.0.0.0", "::", "", "127.0.0.1")]
[True, True, True, False]
"""

from __future__ import annotations

import ipaddress


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost"; False for a host name (other hosts may reach this one by it)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback  # an IPv6 zone (%eth0) is not an address
    except ValueError:
        return False


def is_wildcard(address: str) -> bool:
    """Every interface of this host: what a server binds to be reachable on all of them."""
    return address in ("0.0.0.0", "::", "")
