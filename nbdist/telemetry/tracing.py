"""RPC tracing: every RPC the user's code makes is timed on the rank that makes it.

Each traced call leaves one row (caller, callee, function, latency, payload bytes); workers ship
their rows with their metrics batches, and ``rpc_stats()`` on the notebook summarises them per
(caller, callee, function). Traced: ``rpc_sync``/``rpc_async``/``remote`` (through the
``torch.distributed.rpc.api`` globals they look up at call time), RRef proxies and a user
RRef's ``to_here``. Not traced: torch's own C++ messages, RPCs before rank 0's world is ready,
calls inside ``paused()``, everything while ``enable(False)``. What each latency and byte
count covers, and what the tracing costs: docs/how-it-works.md, Module notes;
``bench/rpc/metrics.py``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

from .. import world_state
from ..envflag import switched_on
from ..patches import rpc_calls, torch_private
from ..patches.installed import SyncTiming, first_time, forget, has, hooks
from ..patches.thread_states import pin
from ..table import html_table, human_bytes, text_table
from . import outbox, records

__all__ = [
    "RpcStats",
    "arm",
    "clear",
    "enable",
    "enabled",
    "install",
    "paused",
    "payload_bytes",
    "rpc_stats",
    "samples",
    "set_peers",
    "total_calls",
    "uninstall",
    "version",
]

ENV = "NBDIST_TRACE"
KEEP_PER_KEY = 100_000  # latencies kept per (caller, callee, function) for percentiles
KEEP_TIMELINE = 50_000  # most recent calls kept for the dashboard's plots over time
FOLD_AT = 10_000  # rank 0 folds its finished calls into the aggregates beyond this many
_wake = outbox.wake  # a worker's metrics flusher, when the first finished call waits



class _Switch:
    """Whether tracing is on in this process: ``enabled`` (the user's setting, which later
    worlds inherit) and ``on`` (enabled and this world armed: the one flag the hot path
    reads)."""

    def __init__(self) -> None:
        self.enabled = switched_on(ENV)
        self.on = False

    def update(self) -> None:
        self.on = self.enabled and _world().armed


class _TorchNames:
    """What the hot path compares with, taken from torch once it is imported (``install``)."""

    Tensor: Any = None
    proxy_funcs: tuple = (None, None)


_SWITCH_PER_PROCESS = _Switch()
_TORCH_PER_PROCESS = _TorchNames()


class _TracedWorld:
    """What tracing knows of the world this rank is in (a ``world_state`` part): its name,
    whether the world is ready (armed), its wall clock's offset and how to find the live
    workers (rank 0, for ``enable(everywhere)``). Its end stops tracing until the next arm."""

    def __init__(self) -> None:
        self.caller = "worker0"
        self.armed = False
        self.wall_offset = time.time() - perf_counter()
        self.peers: Callable[[], list[str]] | None = None

    def close(self) -> None:
        _SWITCH_PER_PROCESS.update()


_NO_WORLD = _TracedWorld()  # between worlds: never armed, never changed


def _world() -> _TracedWorld:
    return world_state.peek(_TracedWorld) or _NO_WORLD


class _Local(threading.local):
    paused = 0  # class defaults: reading a missing attribute of a local is slow
    call: Any = None  # (t0, func, args) of the Python call being sent
    sync = False  # inside a traced rpc_sync: time it when it returns, no future callback
    sync_done: Any = None  # (callee, name, t0, bytes) of that call


class _Calls:
    """Per process: each thread's call in flight, the calls finished and not yet folded
    into the aggregates, and the lock ``install`` takes."""

    def __init__(self) -> None:
        self.tls = _Local()
        self.done: collections.deque = collections.deque()  # (callee, fn, t0, latency, bytes)
        self.install_lock = threading.Lock()


_CALLS_PER_PROCESS = _Calls()


# ---------------------------------------------------------------------------- hot path
def payload_bytes(t: Any) -> int:
    """The bytes a tensor of any kind carries: ``nbytes`` for a dense one; for a sparse one
    its indices and values, for a nested one its buffer; 0 for a meta tensor (no data) or a
    kind this does not know. The kind is checked before the size: ``nbytes`` refuses sparse
    COO and, for a compressed sparse or meta tensor, counts the dense size, not what goes."""
    try:
        if t.layout is _strided() and not (t.is_nested or t.is_meta):
            return t.nbytes  # the common case first: this runs for every tensor of every call
        if t.is_meta:
            return 0
        parts = _COMPRESSED.get(str(t.layout))
        if parts is not None:
            return sum(getattr(t, name)().nbytes for name in parts)
        if t.is_sparse:
            return t._indices().nbytes + t._values().nbytes
        if t.is_nested:
            try:
                return t.values().nbytes  # jagged: one buffer
            except Exception:  # noqa: BLE001 - strided nested: its components
                return sum(c.nbytes for c in t.unbind())
        return t.nbytes
    except Exception:  # noqa: BLE001 - a kind with parts of its own: not counted
        return 0


@functools.lru_cache(maxsize=1)
def _strided() -> Any:
    import torch

    return torch.strided


_ROWS = ("crow_indices", "col_indices", "values")
_COLUMNS = ("ccol_indices", "row_indices", "values")
# a compressed sparse layout -> the methods that give its parts
_COMPRESSED = {"torch.sparse_csr": _ROWS, "torch.sparse_bsr": _ROWS,
               "torch.sparse_csc": _COLUMNS, "torch.sparse_bsc": _COLUMNS}


def _tensor_bytes(tensors: Any) -> int:
    n = 0
    for t in tensors:
        n += payload_bytes(t)
    return n


def _arg_bytes(args: Any, kwargs: Any) -> int:
    n = 0
    for a in args:
        if isinstance(a, _TORCH_PER_PROCESS.Tensor):
            n += payload_bytes(a)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, _TORCH_PER_PROCESS.Tensor):
                n += payload_bytes(a)
    return n


def _value_bytes(v: Any) -> int:
    if isinstance(v, _TORCH_PER_PROCESS.Tensor):
        return payload_bytes(v)
    if isinstance(v, (list, tuple)):
        return _arg_bytes(v, None)
    if isinstance(v, dict):
        return _arg_bytes((), v)
    return 0


def _func_name(func: Any, args: Any) -> str:
    proxies = _TORCH_PER_PROCESS.proxy_funcs
    if func is proxies[0] or func is proxies[1]:  # an RRef proxy: (rref, method, ..)
        try:
            owner_type = args[0]._get_type()  # cached by the proxy: a done future or a type
            if not isinstance(owner_type, type):
                owner_type = owner_type.value()
            return f"{owner_type.__name__}.{args[1]}"
        except Exception:  # noqa: BLE001
            return f"RRef.{args[1]}"
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    return name if isinstance(name, str) else type(func).__name__


def _watch(fut: Any, callee: str, name: str, t0: float, nbytes: int) -> None:
    """Record the call when its future completes (or, in ``rpc_sync``, when it returns)."""
    tls = _CALLS_PER_PROCESS.tls
    if tls.sync:
        tls.sync = False  # the first call inside rpc_sync is the one it waits for
        tls.sync_done = (callee, name, t0, nbytes)
        return
    finished = _CALLS_PER_PROCESS.done

    def done(_f: Any) -> None:
        finished.append((callee, name, t0, perf_counter() - t0, nbytes))
        pin()  # torch's thread: keep its Python state for the next callback
        if len(finished) > FOLD_AT:
            _fold()
        elif len(finished) == 1:
            _wake()  # a worker's flusher sleeps until something is to ship

    fut.add_done_callback(done)


def _wrap_rpc_sync(orig: Any) -> Any:
    """``rpc_sync`` is timed when it returns: a future callback would run on torch's thread
    on the way to waking the caller, and cost it several microseconds. (Where the caller's
    patch wraps ``rpc_sync``, it times the call itself (``SyncTiming``), and this wrapper
    is not made.)"""
    from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

    def rpc_sync(to: Any, func: Any, args: Any = None, kwargs: Any = None,
                 timeout: float = UNSET_RPC_TIMEOUT) -> Any:
        if not _sync_begin():
            return orig(to, func, args, kwargs, timeout)
        try:
            return orig(to, func, args, kwargs, timeout)
        finally:
            _sync_end()

    rpc_sync.__doc__ = orig.__doc__
    rpc_sync.__wrapped__ = orig  # type: ignore[attr-defined]
    return rpc_sync


def _sync_begin() -> bool:
    """An ``rpc_sync`` starts: True if it is timed (the caller's wrapper reads the same
    inline, through ``SyncTiming``)."""
    tls = _CALLS_PER_PROCESS.tls
    if not _SWITCH_PER_PROCESS.on or tls.paused:
        return False
    tls.sync = True
    return True


def _sync_end() -> None:
    """The timed ``rpc_sync`` returned (or raised): record the call it waited for."""
    tls = _CALLS_PER_PROCESS.tls
    tls.sync = False
    done = tls.sync_done
    if done is not None:
        tls.sync_done = None
        callee, name, t0, nbytes = done
        finished = _CALLS_PER_PROCESS.done
        finished.append((callee, name, t0, perf_counter() - t0, nbytes))
        if len(finished) > FOLD_AT:
            _fold()
        elif len(finished) == 1:
            _wake()


def _wrap_python_udf(orig: Any) -> Any:
    tls = _CALLS_PER_PROCESS.tls
    def PythonUDF(func: Any, args: Any, kwargs: Any) -> Any:  # noqa: N802 - replaces a class
        if _SWITCH_PER_PROCESS.on and not tls.paused:
            tls.call = (perf_counter(), func, args)
        return orig(func, args, kwargs)

    return PythonUDF


def _take_call() -> Any:
    tls = _CALLS_PER_PROCESS.tls
    call = tls.call
    if call is not None:
        tls.call = None
    return call


def _watch_udf(call: Any, dst: Any, pickled: bytes, tensors: Any, res: Any,
               remote: bool) -> None:
    """A Python call went out (``call``: what ``_take_call`` took before the send)."""
    if _SWITCH_PER_PROCESS.on:
        t0, func, args = call
        fut = res._get_future() if remote else res
        _watch(fut, dst.name, _func_name(func, args), t0, len(pickled) + _tensor_bytes(tensors))


def _wrap_rpc_builtin(orig: Any) -> Any:
    tls = _CALLS_PER_PROCESS.tls
    def invoke(dst: Any, qualname: str, timeout: float, *args: Any, **kwargs: Any) -> Any:
        if not _SWITCH_PER_PROCESS.on or tls.paused:
            return orig(dst, qualname, timeout, *args, **kwargs)
        t0 = perf_counter()
        fut = orig(dst, qualname, timeout, *args, **kwargs)
        _watch(fut, dst.name, qualname, t0, _arg_bytes(args, kwargs))
        return fut

    return invoke


def _wrap_remote_builtin(orig: Any) -> Any:
    tls = _CALLS_PER_PROCESS.tls
    def invoke(dst: Any, qualname: str, timeout: float, *args: Any, **kwargs: Any) -> Any:
        if not _SWITCH_PER_PROCESS.on or tls.paused:
            return orig(dst, qualname, timeout, *args, **kwargs)
        t0 = perf_counter()
        rref = orig(dst, qualname, timeout, *args, **kwargs)
        _watch(rref._get_future(), dst.name, qualname, t0, _arg_bytes(args, kwargs))
        return rref

    return invoke


def _wrap_rpc_script(orig: Any) -> Any:
    tls = _CALLS_PER_PROCESS.tls
    def invoke(dst: str, qualname: str, args: Any, kwargs: Any, timeout: float,
               is_async: bool) -> Any:
        if not _SWITCH_PER_PROCESS.on or tls.paused:
            return orig(dst, qualname, args, kwargs, timeout, is_async)
        t0 = perf_counter()
        fut = orig(dst, qualname, args, kwargs, timeout, is_async)
        _watch(fut, dst, qualname, t0, _arg_bytes(args, kwargs))
        return fut

    return invoke


def _wrap_remote_script(orig: Any) -> Any:
    tls = _CALLS_PER_PROCESS.tls
    def invoke(dst: str, qualname: str, timeout: float, is_async: bool, *args: Any,
               **kwargs: Any) -> Any:
        if not _SWITCH_PER_PROCESS.on or tls.paused:
            return orig(dst, qualname, timeout, is_async, *args, **kwargs)
        t0 = perf_counter()
        rref = orig(dst, qualname, timeout, is_async, *args, **kwargs)
        _watch(rref._get_future(), dst, qualname, t0, _arg_bytes(args, kwargs))
        return rref

    return invoke


def _wrap_to_here(orig: Any) -> Any:
    from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

    tls = _CALLS_PER_PROCESS.tls
    finished = _CALLS_PER_PROCESS.done

    def to_here(self: Any, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
        if not _SWITCH_PER_PROCESS.on or tls.paused or self.is_owner():
            return orig(self, timeout)
        t0 = perf_counter()
        value = orig(self, timeout)
        finished.append((self.owner_name(), "RRef.to_here", t0, perf_counter() - t0,
                      _value_bytes(value)))
        if len(finished) > FOLD_AT:
            _fold()
        elif len(finished) == 1:
            _wake()
        return value

    to_here.__doc__ = orig.__doc__
    return to_here


# ---------------------------------------------------------------------------- set-up
def install(rank: int, name: str) -> None:
    """Wrap torch's RPC entry points in this process (once) and hold tracing until ``arm``.

    Called on every rank as it joins a world, before ``init_rpc``.
    """
    install_lock = _CALLS_PER_PROCESS.install_lock
    with install_lock:
        here = world_state.part(_TracedWorld)
        here.caller, here.armed = name, False
        if rank != 0:  # a worker takes the notebook's setting through its environment
            _SWITCH_PER_PROCESS.enabled = switched_on(ENV)
        _SWITCH_PER_PROCESS.update()
        if not torch_private.usable("tracing") or not first_time("tracing"):
            return
        import torch

        _TORCH_PER_PROCESS.Tensor = torch.Tensor
        _TORCH_PER_PROCESS.proxy_funcs = rpc_calls.rref_proxy_functions()
        wraps = {"python_udf": _wrap_python_udf, "rpc_builtin": _wrap_rpc_builtin,
                 "remote_builtin": _wrap_remote_builtin, "rpc_script": _wrap_rpc_script,
                 "remote_script": _wrap_remote_script, "to_here": _wrap_to_here}
        callers_sync = has("rpc_hooks.caller")  # its rpc_sync times the call: no 2nd wrapper
        if callers_sync:
            hooks().sync_timing = SyncTiming(_SWITCH_PER_PROCESS, _CALLS_PER_PROCESS.tls,
                                             _sync_end)
        rpc_calls.install_tracing(wraps, rpc_calls.UdfTiming(_take_call, _watch_udf),
                                  None if callers_sync else _wrap_rpc_sync)


def uninstall() -> list[str]:
    """torch's RPC entry points untimed again; what stayed in place (another feature's
    wrapper on top: uninstall that first)."""
    install_lock = _CALLS_PER_PROCESS.install_lock
    with install_lock:
        left = rpc_calls.uninstall_tracing()
        if not left:
            hooks().sync_timing = None
            forget("tracing")
    return left


def set_peers(peers: Callable[[], list[str]] | None) -> None:
    """Register how to find the live workers' names (the cluster layer does, at start)."""
    world_state.part(_TracedWorld).peers = peers


def arm(rank: int, name: str) -> None:
    """This rank's world is ready: trace from now on (the rank's start-up calls this)."""
    here = world_state.part(_TracedWorld)
    here.caller, here.wall_offset, here.armed = name, time.time() - perf_counter(), True
    _SWITCH_PER_PROCESS.update()


def enabled() -> bool:
    """Whether RPCs made on this rank are being traced."""
    return _SWITCH_PER_PROCESS.enabled


def _set_enabled(on: bool) -> bool:
    _SWITCH_PER_PROCESS.enabled = bool(on)
    os.environ[ENV] = "1" if on else "0"
    _SWITCH_PER_PROCESS.update()
    return _SWITCH_PER_PROCESS.enabled


def enable(on: bool = True, everywhere: bool = True, timeout: float = 10.0) -> None:
    """Switch RPC tracing on or off, here and (``everywhere``) on every worker of the world.

    Worlds started later inherit the setting (through the ``NBDIST_TRACE`` environment
    variable). Off, each RPC pays one flag test in each wrapper.
    """
    _set_enabled(on)
    if not everywhere:
        return
    find = _world().peers
    peers = find() if find is not None else []
    if not peers:
        return
    import torch.distributed.rpc as rpc

    with paused():
        futs = [rpc.rpc_async(nm, _set_enabled, args=(on,), timeout=timeout) for nm in peers]
        for fut in futs:
            fut.wait()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Do not trace RPCs made by this thread inside the ``with`` block."""
    tls = _CALLS_PER_PROCESS.tls
    tls.paused += 1
    try:
        yield
    finally:
        tls.paused -= 1


# ---------------------------------------------------------------------------- aggregation
class _KeyStats:
    __slots__ = ("count", "bytes", "max", "latencies")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.max = 0.0
        self.latencies: collections.deque = collections.deque(maxlen=KEEP_PER_KEY)


class _Aggregates:
    """Every rank's traced calls received in this process: per key, the recent timeline, and
    a count of changes. Per process, outliving worlds, as the notebook's own records do."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: dict[tuple[str, str, str], _KeyStats] = {}
        self.timeline: collections.deque = collections.deque(maxlen=KEEP_TIMELINE)
        self.version = 0


_AGG_PER_PROCESS = _Aggregates()


def _take_done() -> list[tuple]:
    """Completed calls of this rank as ``(callee, function, wall time, latency, bytes)``."""
    finished = _CALLS_PER_PROCESS.done
    n = len(finished)
    pop = finished.popleft
    off = _world().wall_offset
    rows = []
    try:
        for _ in range(n):
            callee, name, t0, lat, nbytes = pop()
            rows.append((callee, name, t0 + off, lat, nbytes))
    except IndexError:  # another thread took some of them first
        pass
    return rows


def _add(caller: str, rows: list[tuple]) -> None:
    if not rows:
        return
    agg = _AGG_PER_PROCESS
    with agg.lock:
        for callee, name, t, lat, nbytes in rows:
            key = (caller, callee, name)
            s = agg.keys.get(key)
            if s is None:
                s = agg.keys[key] = _KeyStats()
            s.count += 1
            s.bytes += nbytes
            if lat > s.max:
                s.max = lat
            s.latencies.append(lat)
            agg.timeline.append((t, caller, callee, name, lat, nbytes))
        agg.version += 1


def _drain_local() -> None:
    finished = _CALLS_PER_PROCESS.done
    if finished:
        _add(_world().caller, _take_done())


def _fold() -> None:
    """Rank 0's finished calls grew while nobody read them: fold them into the aggregates.

    A worker's flusher ships its calls instead (``_ship``), woken by the first of them.
    """
    if not records.is_worker():
        _drain_local()


def _ship() -> list[dict]:
    """Worker side: this rank's new rows as internal records for the next metrics batch."""
    finished = _CALLS_PER_PROCESS.done
    if not finished:
        return []
    return [{records.INTERNAL: "trace", "caller": _world().caller, "rows": _take_done()}]


def _receive(rec: dict) -> None:
    """Notebook side: rows a worker shipped."""
    _add(rec["caller"], rec["rows"])


records.register_internal("trace", _receive, source=_ship)


def version() -> int:
    """A number that changes whenever new calls were added (cheap polling for displays)."""
    _drain_local()
    return _AGG_PER_PROCESS.version


def total_calls() -> int:
    """How many calls were traced on every rank (received so far)."""
    _drain_local()
    with _AGG_PER_PROCESS.lock:
        return sum(s.count for s in _AGG_PER_PROCESS.keys.values())


def samples() -> list[tuple]:
    """The most recent calls of every rank, oldest first, as tuples
    ``(wall time, caller, callee, function, latency s, bytes)``."""
    _drain_local()
    with _AGG_PER_PROCESS.lock:
        return list(_AGG_PER_PROCESS.timeline)


def clear() -> None:
    """Forget every call traced so far (on the notebook; workers' unsent rows still arrive)."""
    _take_done()
    agg = _AGG_PER_PROCESS
    with agg.lock:
        agg.keys.clear()
        agg.timeline.clear()
        agg.version += 1


def rpc_stats(caller: str | None = None, callee: str | None = None,
              function: str | None = None) -> RpcStats:
    """Per (caller, callee, function): count, p50/p95/max latency (ms) and bytes sent.

    Covers the calls of every rank received so far (a worker's calls arrive within 50 ms, and
    before the result of the ``%%dist`` cell that made them). Percentiles are over the last
    100,000 calls of each row; count, max and bytes over all of them.
    """
    import numpy as np

    _drain_local()
    with _AGG_PER_PROCESS.lock:
        items = [(k, s.count, s.bytes, s.max, list(s.latencies))
                 for k, s in _AGG_PER_PROCESS.keys.items()
                 if (caller is None or k[0] == caller) and (callee is None or k[1] == callee)
                 and (function is None or k[2] == function)]
    rows = []
    for (cr, ce, fn), count, nbytes, mx, lats in sorted(items, key=lambda i: i[0]):
        p50, p95 = np.percentile(np.asarray(lats), [50, 95]) if lats else (0.0, 0.0)
        rows.append({"caller": cr, "callee": ce, "function": fn, "count": count,
                     "p50_ms": float(p50) * 1e3, "p95_ms": float(p95) * 1e3,
                     "max_ms": mx * 1e3, "bytes": nbytes})
    return RpcStats(rows)


class RpcStats:
    """The rows of ``rpc_stats()``: a text table, an HTML table in a notebook, a DataFrame."""

    COLUMNS = ("caller", "callee", "function", "count", "p50_ms", "p95_ms", "max_ms", "bytes")

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict]:
        return iter(self.rows)

    def get(self, caller: str, callee: str, function: str) -> dict | None:
        """The row of one (caller, callee, function), or None."""
        for r in self.rows:
            if (r["caller"], r["callee"], r["function"]) == (caller, callee, function):
                return r
        return None

    def total(self) -> int:
        """Calls counted over all rows."""
        return sum(r["count"] for r in self.rows)

    def frame(self) -> Any:
        """The rows as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(self.COLUMNS))

    def _cells(self, r: dict) -> list[str]:
        return [r["caller"], r["callee"], r["function"], str(r["count"]), f"{r['p50_ms']:.3f}",
                f"{r['p95_ms']:.3f}", f"{r['max_ms']:.3f}", human_bytes(r["bytes"])]

    def __str__(self) -> str:
        if not self.rows:
            return "no RPCs traced yet"
        return text_table(self.COLUMNS, [self._cells(r) for r in self.rows])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if not self.rows:
            return "<i>no RPCs traced yet</i>"
        return html_table("nbdist-rpc-stats", self.COLUMNS,
                          [self._cells(r) for r in self.rows])


