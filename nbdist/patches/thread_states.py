"""Keep the Python thread state of torch's RPC threads from one call to the next.

torch takes the GIL on its own RPC threads with pybind11's ``gil_scoped_acquire``, which makes
and destroys a ``PyThreadState`` (and every ``threading.local``) each time. ``pin()`` holds one
more reference on the calling thread's state so it is reused; ``install()`` pins every thread
that unpickles an RPC message, and callbacks pin theirs. Contract: a pinned state outlives its
thread (a few KB per world, freed at exit). ``NBDIST_KEEP_THREAD_STATES=0`` turns it off
(``bench/rpc/rpc.py --unpinned``). Measurements: ``bench/results/notes.md``.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..envflag import switched_on
from . import torch_private
from .installed import first_time, forget
from .replaced import replace, restore

__all__ = ["ENV", "install", "pin", "uninstall"]

ENV = "NBDIST_KEEP_THREAD_STATES"


class _Pinning:
    """Whether pinning is switched off in this process (``install`` reads ``ENV``)."""

    def __init__(self) -> None:
        self.off = False


class _Pinned(threading.local):
    """Whether this thread state is pinned (a thread's starts False)."""

    done = False  # the default every thread reads until it pins; never set on the class


_PINNING_PER_PROCESS = _Pinning()
_PINNED_PER_PROCESS = _Pinned()  # each thread's own flag
_ensure = ctypes.pythonapi.PyGILState_Ensure


def pin() -> None:
    """Keep the calling thread's Python thread state alive for good (idempotent, cheap)."""
    local = _PINNED_PER_PROCESS
    if not local.done:
        if _PINNING_PER_PROCESS.off:  # switched off: no thread is pinned
            return
        local.done = True
        _ensure()


def install() -> None:
    """Pin each thread that unpickles an RPC message in this process (idempotent)."""
    off = _PINNING_PER_PROCESS.off = not switched_on(ENV)  # off: pin() does nothing
    if (off or not torch_private.usable("thread_states")
            or not first_time("thread_states")):
        return
    from torch.distributed.rpc import internal

    pickler = internal._internal_rpc_pickler
    deserialize = pickler.deserialize

    def deserialize_pinned(binary_data: Any, tensor_table: Any) -> Any:
        pin()
        return deserialize(binary_data, tensor_table)

    replace("thread_states", pickler, "deserialize", deserialize_pinned)


def uninstall() -> list[str]:
    """RPC threads unpickle with torch's own ``deserialize`` again (threads pinned stay so);
    what stayed in place."""
    left = restore("thread_states")
    if not left:
        forget("thread_states")
    return left
