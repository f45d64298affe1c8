"""The process-wide count that names the keys of a graceful ``rpc.shutdown()``'s barrier.

torch's RPC agent joins its peers at ``rpc.shutdown()`` through store keys numbered by a C++
static of libtorch (``barrierId``) that every ``join`` advances and nothing resets. Processes
that met through different numbers of graceful shutdowns before (the notebook and a kept
worker after two spawns, a fresh worker after none) wait for keys the others never write.
``restart`` sets it to 0, so every member of a fresh RPC group starts from the same number;
call it only where no RPC agent runs. The static is found by name in libtorch's ELF symbol
table, as ``rref_reset`` finds its own.
"""

from __future__ import annotations

import ctypes
import sys
from functools import lru_cache

from .elf_symbols import elf_symbols, libtorch_cpu

__all__ = ["available", "restart"]

_ANCHOR = "_ZN5torch11distributed3rpc11RRefContext11getInstanceEv"  # exported: gives the base
_BARRIER_ID = "_ZN5torch11distributed3rpcL9barrierIdE"  # static std::atomic<int>


@lru_cache(maxsize=1)
def _address() -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    path = libtorch_cpu()
    try:
        syms = elf_symbols(path, [_ANCHOR, _BARRIER_ID])
        anchor = ctypes.cast(getattr(ctypes.CDLL(path), _ANCHOR), ctypes.c_void_p).value
    except (OSError, AttributeError, ValueError):
        return None
    if len(syms) != 2 or not anchor:
        return None
    return anchor - syms[_ANCHOR] + syms[_BARRIER_ID]


def available() -> bool:
    """Whether this torch build lets nbdist set the count."""
    return _address() is not None


def restart() -> bool:
    """Number the next graceful shutdown's keys from 0 again; True if done."""
    addr = _address()
    if addr is None:
        return False
    ctypes.c_int32.from_address(addr).value = 0
    return True
