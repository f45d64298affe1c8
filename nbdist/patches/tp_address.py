"""Choose the address rank 0's TensorPipe listens on, world after world.

torch computes that address once per process (``TensorPipeAgent::guessAddress`` keeps it in a
function-local static, from ``TP_SOCKET_IFNAME`` at the first ``init_rpc``), so after a local
world on loopback the notebook would advertise ``127.0.0.1`` to remote hosts, and after a
world across hosts a local world would listen on the network. ``pin(address)`` rewrites that
static in place before ``init_rpc``: an IPv4 address always fits std::string's inline buffer
(15 characters), so only bytes inside the string object change. It is written only where
libtorch's symbol table gives the string 32 bytes and its guard 8, the guard reads as built and
the string as an inline one; the write is read back. Verified by
``tests/hosts/test_multihost.py`` (a local world, then one across hosts, then a local one again).
"""

from __future__ import annotations

import ctypes
import ipaddress

from .elf_symbols import statics
from .features import turn_off

__all__ = ["available", "current", "pin"]

_VALUE = "_ZZN5torch11distributed3rpc15TensorPipeAgent12guessAddressB5cxx11EvE9uvAddress"
_GUARD = "_ZGVZN5torch11distributed3rpc15TensorPipeAgent12guessAddressB5cxx11EvE9uvAddress"
_INLINE = 15  # characters std::string (libstdc++, C++11 ABI) holds without allocating
# (symbol, bytes): std::string (pointer, length, 16-byte inline buffer), its guard (64 bits)
_LAYOUT = ((_VALUE, 32), (_GUARD, 8))


def _addresses() -> tuple[int, ...] | None:
    """Runtime addresses of the cached std::string and its initialisation guard, or None."""
    return statics(*_LAYOUT)


def available() -> bool:
    """Whether this torch build lets nbdist choose the address."""
    return _addresses() is not None


def current() -> str | None:
    """The address torch cached, or None if it has not computed one yet (or cannot tell)."""
    addrs = _addresses()
    if addrs is None or ctypes.c_uint8.from_address(addrs[1]).value == 0:
        return None
    value, _ = addrs
    ptr = ctypes.c_uint64.from_address(value).value
    length = ctypes.c_uint64.from_address(value + 8).value
    if ptr != value + 16 or length > _INLINE:
        return None
    return ctypes.string_at(value + 16, length).decode()


def pin(address: str) -> bool:
    """Make rank 0's next TensorPipe agent listen on ``address`` (an IPv4 address); True when
    done or nothing is cached yet (then ``TP_SOCKET_IFNAME`` decides, as usual)."""
    ipaddress.IPv4Address(address)  # never anything but an address into that buffer
    addrs = _addresses()
    if addrs is None:
        return False
    value, guard = addrs
    built = ctypes.c_uint64.from_address(guard).value
    if built == 0:
        return True  # not computed yet: the environment variable is read at first use
    if built != 1:
        return turn_off("tp_address", f"libtorch's TensorPipe address guard reads {built:#x}: "
                                      "left as it was")
    ptr = ctypes.c_uint64.from_address(value).value
    length = ctypes.c_uint64.from_address(value + 8).value
    if ptr != value + 16 or length > _INLINE or len(address) > _INLINE:
        return False  # not the inline layout this relies on (a longer address): leave it
    raw = address.encode()
    ctypes.memmove(value + 16, raw + b"\0", len(raw) + 1)
    ctypes.c_uint64.from_address(value + 8).value = len(raw)
    return current() == address
