"""Let one process hold RRefs in world after world.

``reset_singleton()`` (after ``rpc.shutdown``, before the next ``init_rpc``) clears torch's
process-wide ``RRefContext`` so the next world builds one around its own agent;
``start_ids_at(epoch)`` (each worker, right after ``init_rpc``) gives each world's RRef ids their
own range, so a stale RRef of an earlier world names nothing in this one. Where libtorch's
symbols cannot be found, ``available()`` is False and a second world refuses RRef work loudly.
Private names, checked by ``tests/unit/test_torch_pins.py``; why and how:
docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import ctypes
import re

from .elf_symbols import in_libtorch, libtorch_cpu as _libtorch_cpu

__all__ = ["available", "next_id", "reset_singleton", "start_ids_at"]

_CTX = "_ZZN5torch11distributed3rpc11RRefContext11getInstanceEvE7context"
_GUARD = "_ZGVZN5torch11distributed3rpc11RRefContext11getInstanceEvE7context"
_NEXT_ID = "_ZN5torch11distributed3rpc11RRefContext12nextLocalId_E"
_DTOR = "_ZN5torch11distributed3rpc11RRefContextD1Ev"
_LOCAL_ID = re.compile(r"local_id=(\d+)")


def _addresses() -> tuple[int, ...] | None:
    """Runtime addresses of the singleton pointer, its guard and the id counter, or None."""
    return in_libtorch(_CTX, _GUARD, _NEXT_ID)


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
    ctx, guard, _ = addrs
    if ctypes.c_uint8.from_address(guard).value == 0:
        return True  # never built in this process: nothing to forget
    old = ctypes.c_uint64.from_address(ctx).value
    ctypes.c_uint64.from_address(ctx).value = 0
    ctypes.c_uint64.from_address(guard).value = 0
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
    if counter.value > target:
        return True  # already past it (the notebook's own counter only grows)
    counter.value = target
    return next_id() == target + 1
