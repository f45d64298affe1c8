"""torch's Python RPC entry points, wrapped for the two features that watch each call: the
pickler (``shipping``: requests pickled by nbdist's pickler, and which code a peer holds once
a request carried it) and ``tracing`` (each call timed). The features hand in what they do;
only this module knows where in torch it goes, and only it replaces torch's attributes.

The two Python-UDF sends (``api._invoke_rpc_python_udf`` / ``_invoke_remote_python_udf``)
are wrapped once for both features (``_wrap_udf_send``): before the send, tracing's
``UdfTiming.take()``; after it, shipping's ``sent()``, then tracing's ``UdfTiming.watch``.
That wrapper (feature ``udf_send``) stays while either feature is installed.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .replaced import replace, restore

__all__ = [
    "TRACED",
    "UdfTiming",
    "install_shipping",
    "install_tracing",
    "rref_proxy_functions",
    "uninstall_shipping",
    "uninstall_tracing",
]

#: What tracing may wrap, by the name the feature uses: where it is in torch.
TRACED = {
    "python_udf": ("api", "PythonUDF"),
    "rpc_builtin": ("api", "_invoke_rpc_builtin"),
    "remote_builtin": ("api", "_invoke_remote_builtin"),
    "rpc_script": ("api", "_invoke_rpc_torchscript"),
    "remote_script": ("api", "_invoke_remote_torchscript"),
    "to_here": ("PyRRef", "to_here"),
}
_UDF_SENDS = {"_invoke_rpc_python_udf": False, "_invoke_remote_python_udf": True}  # remote?


@dataclass
class UdfTiming:
    """Tracing's part of a Python-UDF send: ``take()`` before it (what to time, or None),
    ``watch(taken, dst, pickled, tensors, result, remote)`` after it (only if taken)."""

    take: Callable[[], Any]
    watch: Callable[[Any, Any, bytes, Any, Any, bool], None]


class _Watchers:
    """Who watches the Python-UDF sends in this process (None: nobody, for that part)."""

    def __init__(self) -> None:
        self.sent: Callable[[], None] | None = None  # shipping's
        self.timing: UdfTiming | None = None  # tracing's
        self.lock = threading.Lock()


_WATCHERS_PER_PROCESS = _Watchers()


def _wrap_udf_send(orig: Callable, remote: bool) -> Callable:
    watchers = _WATCHERS_PER_PROCESS

    def send(dst: Any, pickled: bytes, tensors: Any, timeout: float, is_async: bool) -> Any:
        timing = watchers.timing
        taken = timing.take() if timing is not None else None
        res = orig(dst, pickled, tensors, timeout, is_async)
        sent = watchers.sent
        if sent is not None:
            sent()
        if taken is not None:
            timing.watch(taken, dst, pickled, tensors, res, remote)  # type: ignore[union-attr]
        return res

    send.__wrapped__ = orig  # type: ignore[attr-defined]
    return send


def _watch_sends(part: str, value: Any) -> list[str]:
    """Set the ``part`` watcher (None: leave); wrap the sends on the first watcher, unwrap
    them after the last. What stayed wrapped by another feature on top, if anything."""
    from torch.distributed.rpc import api

    watchers = _WATCHERS_PER_PROCESS
    with watchers.lock:
        before = watchers.sent is not None or watchers.timing is not None
        setattr(watchers, part, value)
        after = watchers.sent is not None or watchers.timing is not None
        if after and not before:
            for name, remote in _UDF_SENDS.items():
                replace("udf_send", api, name, _wrap_udf_send(getattr(api, name), remote))
        elif before and not after:
            return restore("udf_send")
    return []


# ---------------------------------------------------------------------------- shipping
def install_shipping(serialize: Callable[[Any, Any], tuple[bytes, list]],
                     wrap_to_worker_info: Callable[[Callable], Callable],
                     sent: Callable[[], None]) -> Any:
    """torch's RPC pickles with ``serialize(pickler, obj)``, resolves destinations through
    ``wrap_to_worker_info(torch's)``, and calls ``sent()`` after each Python-UDF request
    went out. Returns torch's thread-local tensor tables (the pickler's protocol with it)."""
    from torch.distributed.rpc import api, internal

    pickler = internal._internal_rpc_pickler
    replace("shipping", pickler, "serialize", types.MethodType(serialize, pickler))
    replace("shipping", api, "_to_worker_info", wrap_to_worker_info(api._to_worker_info))
    _watch_sends("sent", sent)
    return internal._thread_local_tensor_tables


def uninstall_shipping() -> list[str]:
    """torch's own pickler and destinations again; what stayed (another feature's wrapper
    on top: uninstall that first)."""
    left = restore("shipping")
    return left or _watch_sends("sent", None)


# ---------------------------------------------------------------------------- tracing
def _owners() -> dict[str, Any]:
    from torch._C._distributed_rpc import PyRRef
    from torch.distributed.rpc import api

    return {"api": api, "PyRRef": PyRRef}


def install_tracing(wraps: dict[str, Callable[[Any], Any]], timing: UdfTiming,
                    rpc_sync: Callable[[Any], Any] | None) -> None:
    """Each of ``TRACED``'s entry points named in ``wraps`` replaced by ``wrap(torch's)``,
    ``timing`` watching the Python-UDF sends, and (unless None) ``rpc_sync`` replaced by
    ``rpc_sync(torch's)`` where user code finds it."""
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import api

    owners = _owners()
    for key, wrap in wraps.items():
        where, attr = TRACED[key]
        owner = owners[where]
        replace("tracing", owner, attr, wrap(getattr(owner, attr)))
    if rpc_sync is not None:
        wrapped = rpc_sync(api.rpc_sync)
        for module in (api, rpc):
            replace("tracing", module, "rpc_sync", wrapped)
    _watch_sends("timing", timing)


def uninstall_tracing() -> list[str]:
    """torch's entry points untimed again; what stayed (another feature's wrapper on top)."""
    left = restore("tracing")
    return left or _watch_sends("timing", None)


def rref_proxy_functions() -> tuple[Any, Any]:
    """The functions an RRef proxy (``rref.rpc_sync().method()``) sends, to name its calls."""
    from torch.distributed.rpc import rref_proxy

    return rref_proxy._local_invoke, rref_proxy._local_invoke_async_execution
