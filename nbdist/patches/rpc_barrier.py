"""The process-wide count that names the keys of a graceful ``rpc.shutdown()``'s barrier.

torch's RPC agent joins its peers at ``rpc.shutdown()`` through store keys numbered by a C++
static of libtorch (``barrierId``) that every ``join`` advances and nothing resets. Processes
that met through different numbers of graceful shutdowns before (the notebook and a kept
worker after two spawns, a fresh worker after none) wait for keys the others never write.
``restart`` sets it to 0, so every member of a fresh RPC group starts from the same number;
call it only where no RPC agent runs. The static is found by name in libtorch's ELF symbol
table, as ``rref_reset`` finds its own, and written only where that table gives it 4 bytes
and it reads as a count (not negative); the write is read back.
"""

from __future__ import annotations

import ctypes

from .elf_symbols import statics
from .features import turn_off

__all__ = ["available", "restart"]

_BARRIER_ID = "_ZN5torch11distributed3rpcL9barrierIdE"  # static std::atomic<int>
_LAYOUT = ((_BARRIER_ID, 4),)


def _address() -> int | None:
    found = statics(*_LAYOUT)
    return found[0] if found else None


def available() -> bool:
    """Whether this torch build lets nbdist set the count."""
    return _address() is not None


def restart() -> bool:
    """Number the next graceful shutdown's keys from 0 again; True if done."""
    addr = _address()
    if addr is None:
        return False
    count = ctypes.c_int32.from_address(addr)
    if count.value < 0:
        return turn_off("restart", f"libtorch's rpc::barrierId reads {count.value}: left as it "
                                   "was")
    count.value = 0
    return count.value == 0
