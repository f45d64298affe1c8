"""Let one process hold RRefs in world after world.

``reset_singleton()`` (after ``rpc.shutdown``, before the next ``init_rpc``) clears torch's
process-wide ``RRefContext`` so the next world builds one around its own agent;
``start_ids_at(epoch)`` (each worker, right after ``init_rpc``) gives each world's RRef ids their
own range, so a stale RRef of an earlier world names nothing in this one. Where libtorch's
symbols cannot be found, ``available()`` is False and a second world refuses RRef work loudly.
Each static is written only if the symbol table gives it the size nbdist expects
(``elf_symbols.statics``) and its value reads as that layout; each write is read back.
Private names, checked by ``tests/unit/test_torch_pins.py``; why and how:
docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import ctypes
import re

from .elf_symbols import libtorch_cpu as _libtorch_cpu, statics
from .features import turn_off

__all__ = ["available", "next_id", "reset_singleton", "start_ids_at"]

_CTX = "_ZZN5torch11distributed3rpc11RRefContext11getInstanceEvE7context"
_GUARD = "_ZGVZN5torch11distributed3rpc11RRefContext11getInstanceEvE7context"
_NEXT_ID = "_ZN5torch11distributed3rpc11RRefContext12nextLocalId_E"
_DTOR = "_ZN5torch11distributed3rpc11RRefContextD1Ev"
_LOCAL_ID = re.compile(r"local_id=(\d+)")
# (symbol, bytes): the singleton's pointer (RRefContext*), its guard (Itanium ABI: 64 bits, 1
# once built) and the id counter (std::atomic<int64_t>)
_LAYOUT = ((_CTX, 8), (_GUARD, 8), (_NEXT_ID, 8))
_IDS_END = 1 << 56  # more than any epoch's range start ((255 << 40) + its RRefs)


def _addresses() -> tuple[int, ...] | None:
    """Runtime addresses of the singleton pointer, its guard and the id counter, or None."""
    return statics(*_LAYOUT)


def available() -> bool:
    """Whether this torch build lets nbdist renew the RRef context."""
    return _addresses() is not None


def reset_singleton() -> bool:
    """Forget the RRef context so the next ``init_rpc`` gets a fresh one; True if done.

    The old context is destructed in place (its memory is left allocated, since torch never
    frees it either): that drops its reference to the shut-down agent, whose threads and
    sockets would otherwise outlive every world (16 threads and ~50 descriptors each).
    """
    addrs = _addresses()
    if addrs is None:
        return False
    ctx, guard = (ctypes.c_uint64.from_address(a) for a in addrs[:2])
    if guard.value == 0:
        return True  # never built in this process: nothing to forget
    old = ctx.value
    if guard.value != 1 or old == 0 or old % 8:
        return turn_off("rref_reset", f"libtorch's RRefContext reads as guard "
                                      f"{guard.value:#x}, pointer {old:#x}: left as it was")
    ctx.value = 0
    guard.value = 0
    if ctx.value or guard.value:
        return turn_off("rref_reset", "libtorch's RRefContext did not read back as cleared")
    if old:
        dtor = getattr(ctypes.PyDLL(_libtorch_cpu()), _DTOR)  # PyDLL: keep the GIL
        dtor.argtypes = [ctypes.c_void_p]
        dtor.restype = None
        dtor(ctypes.c_void_p(old))
    return True


def next_id() -> int:
    """The local id the next RRef created in this process will get (needs RPC running)."""
    import torch.distributed.rpc as rpc

    m = _LOCAL_ID.search(repr(rpc.RRef(None)))
    if m is None:
        raise RuntimeError("cannot read an RRef id from its repr")
    return int(m.group(1)) + 1


def start_ids_at(epoch: int) -> bool:
    """Make this process's new RRef ids start at ``(epoch % 255 + 1) << 40``; True if done."""
    addrs = _addresses()
    if addrs is None:
        return False
    target = (epoch % 255 + 1) << 40
    counter = ctypes.c_int64.from_address(addrs[2])
    if not 0 <= counter.value < _IDS_END:
        return turn_off("rref_reset", f"libtorch's RRef id counter reads {counter.value}: "
                                      "left as it was")
    if counter.value > target:
        return True  # already past it (the notebook's own counter only grows)
    counter.value = target
    return counter.value == target and next_id() == target + 1
