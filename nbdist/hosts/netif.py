"""Network interfaces by name or address: what ``--iface`` means and what torch needs.

TensorPipe and Gloo take an interface *name* (``TP_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``);
nbdist's own listeners bind to an *address*. ``resolve`` turns either into both; IPv4 only.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["Interface", "default_interface", "interfaces", "name_of_address", "resolve"]


class Interface(tuple):
    """``(name, address)`` of one IPv4 interface."""

    __slots__ = ()

    def __new__(cls, name: str, address: str) -> Interface:
        return super().__new__(cls, (name, address))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def address(self) -> str:
        return self[1]


def interfaces() -> list[Interface]:
    """Every interface with an IPv4 address on this host (this network namespace)."""
    import psutil

    found = []
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET:
                found.append(Interface(name, a.address))
    return found


def name_of_address(address: str) -> str | None:
    """The interface that holds ``address`` here, or None."""
    for itf in interfaces():
        if itf.address == address:
            return itf.name
    return None


def default_interface() -> Interface | None:
    """The interface of this host's default route (``/proc/net/route``), with its address;
    None where there is no default route or it has no IPv4 address."""
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return None
    names = [r[0] for r in rows if len(r) > 2 and r[1] == "00000000"]
    for itf in interfaces():
        if names and itf.name == names[0]:
            return itf
    return None


def resolve(value: str) -> Interface:
    """``--iface`` as given (an interface name or one of this host's IPv4 addresses)."""
    value = (value or "").strip()
    known = interfaces()
    try:
        ipaddress.IPv4Address(value)
        is_address = True
    except ValueError:
        is_address = False
    for itf in known:
        if (itf.address if is_address else itf.name) == value:
            if ipaddress.IPv4Address(itf.address).is_unspecified:
                break
            return itf
    if value in ("0.0.0.0", "", "*", "any"):
        raise ValueError("--iface must name one interface or address the other hosts reach, "
                         "not every interface")
    listing = ", ".join(f"{i.name} ({i.address})" for i in known) or "none"
    raise ValueError(f"--iface {value!r} is not an interface or IPv4 address of this machine; "
                     f"it has: {listing}")
