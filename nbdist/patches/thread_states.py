"""Keep the Python thread state of torch's RPC threads from one call to the next.

torch runs Python on its own C++ threads (its RPC thread pool): to unpickle every request and
reply, to run the function, to call future callbacks. It takes the GIL there with pybind11's
``gil_scoped_acquire``, which, on a thread Python did not start, makes a fresh
``PyThreadState`` each time and destroys it on release, and with it the thread's frame stack
memory and every ``threading.local`` value. For a small RPC that churn, paid several times per
call on both sides, was most of the gap between nbdist and plain torch: measured 1.21x plain
torch without ``pin`` and 0.94x with it (``rpc_sync`` of 16 bytes, ``bench/rpc.py``).

``pin()`` takes one more reference on the calling thread's state (``PyGILState_Ensure``, never
released), so pybind11 finds and reuses it on the next call. ``install()`` pins every thread
that unpickles an RPC message; callbacks pin their thread too. ``NBDIST_KEEP_THREAD_STATES=0``
turns it off (to compare, or should a C extension mind): ``bench/rpc.py --unpinned``.

Cost: a pinned state outlives its thread. Each world's RPC threads (16) leave theirs behind
when the world ends; in the notebook, which runs one world after another, that is about 5 KB
per restart (measured 0.07 MB over 12 restarts), freed when the kernel exits.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..envflag import switched_on
from . import torch_private

__all__ = ["ENV", "install", "pin"]

ENV = "NBDIST_KEEP_THREAD_STATES"


class _Pinned(threading.local):
    """Whether this thread state is pinned: a new one reads the class default (False, or
    True while pinning is switched off)."""

    done = False


_local = _Pinned()
_ensure = ctypes.pythonapi.PyGILState_Ensure
_installed = False


def pin() -> None:
    """Keep the calling thread's Python thread state alive for good (idempotent, cheap)."""
    local = _local
    if not local.done:
        local.done = True
        _ensure()


def install() -> None:
    """Pin each thread that unpickles an RPC message in this process (idempotent)."""
    global _installed
    _Pinned.done = not switched_on(ENV)  # off: every thread reads "pinned", pin() does nothing
    if _Pinned.done or _installed or not torch_private.usable("thread_states"):
        return
    from torch.distributed.rpc import internal

    pickler = internal._internal_rpc_pickler
    deserialize = pickler.deserialize

    def deserialize_pinned(binary_data: Any, tensor_table: Any) -> Any:
        pin()
        return deserialize(binary_data, tensor_table)

    pickler.deserialize = deserialize_pinned
    _installed = True
