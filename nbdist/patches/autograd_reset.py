"""Give a process's next ``init_rpc`` an empty distributed autograd container, as a fresh
process has.

torch keeps every distributed autograd context of a process in one C++ singleton
(``DistAutogradContainer``) that ``init_rpc`` initialises once and nothing empties. A context
an earlier run left behind (a peer's cleanup message that never came before its
``shutdown``, a test that failed inside ``dist_autograd.context()``) stays counted in the next
run's ``_get_debug_info()`` and in memory. ``renew()`` drops the singleton's pointer so the
next ``init_rpc`` builds and initialises a new one; the old one is left allocated (torch
never frees it either, and has no destructor to call), with whatever it held. Call it only
where no RPC agent runs. The statics are found by name in libtorch's ELF symbol table, as
``rref_reset`` finds its own.
"""

from __future__ import annotations

import ctypes

from .elf_symbols import in_libtorch

__all__ = ["available", "renew"]

_STATIC = "N5torch11distributed8autograd21DistAutogradContainer19getInstanceInternalEvE9container"
_HOLDER = "_ZZ" + _STATIC  # the function-local ``static DistAutogradContainer* container``
_GUARD = "_ZGVZ" + _STATIC  # ... and its initialisation guard


def _addresses() -> tuple[int, ...] | None:
    """Runtime addresses of the singleton's pointer and its initialisation guard, or None."""
    return in_libtorch(_HOLDER, _GUARD)


def available() -> bool:
    """Whether this torch build lets nbdist renew the container."""
    return _addresses() is not None


def renew() -> bool:
    """Make the next use of distributed autograd build a new, empty container; True if done
    (or nothing was ever built). Until ``init_rpc`` initialises it, distributed autograd
    refuses to run, as in a fresh process."""
    addrs = _addresses()
    if addrs is None:
        return False
    holder, guard = addrs
    if ctypes.c_uint8.from_address(guard).value == 0:
        return True  # never built in this process: already empty
    ctypes.c_uint64.from_address(holder).value = 0
    ctypes.c_uint64.from_address(guard).value = 0
    return True
