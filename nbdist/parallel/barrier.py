"""``barrier``: wait until every named rank has reached it, or raise saying who did not.

torch's private ``rpc.api._barrier`` (what TorchOpt calls) logs a failure and returns as if
all went well, and with a timeout its leader stops waiting and carries on. Here one leader
(the lowest rank taking part) holds a generation of arrivals; every rank's wait ends together
when the last arrives, or every rank raises ``BarrierError`` listing the workers that were
missing: on a timeout, when a rank died, or when the leader gave up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from . import world as _world
from .errors import BarrierError
from .world import get_worker_id, get_world_info, rpc_live

__all__ = ["barrier"]

try:
    import torch
    import torch.distributed.rpc as _rpc

    _async_execution = _rpc.functions.async_execution
except (ImportError, AttributeError):  # pragma: no cover - torch without RPC
    _rpc = None

    def _async_execution(fn: Any) -> Any:
        return fn

_lock = threading.Lock()
_owner: Any = None  # the nbdist Cluster (or None) the state below belongs to
_waiting: dict[tuple[str, ...], dict[str, Any]] = {}  # group -> name -> its future


def _state() -> dict[tuple[str, ...], dict[str, Any]]:
    """The leader's arrivals, forgotten when this process joined a different world."""
    global _owner
    from .. import cluster

    owner = cluster.current()
    if owner is not _owner:
        _owner = owner
        _waiting.clear()
    return _waiting


def _arrive_now(group: tuple[str, ...], name: str) -> Any:
    """Record ``name``'s arrival; the future completes when the whole group has arrived."""
    fut: torch.futures.Future = torch.futures.Future()
    release: list[Any] = []
    with _lock:
        arrived = _state().setdefault(group, {})
        if name in arrived:
            fut.set_exception(BarrierError(f"{name} reached the barrier twice"))
            return fut
        arrived[name] = fut
        if set(arrived) == set(group):
            release = list(_state().pop(group).values())
    for f in release:
        f.set_result(None)
    return fut


@_async_execution
def _arrive(group: tuple[str, ...], name: str) -> Any:
    """RPC target on the leader (async: holds no thread while it waits)."""
    return _arrive_now(group, name)


def _withdraw(group: tuple[str, ...], name: str) -> list[str]:
    """Take back ``name``'s arrival after it gave up; returns who had not arrived."""
    with _lock:
        arrived = _state().get(group, {})
        missing = sorted(set(group) - set(arrived))
        arrived.pop(name, None)
        if not arrived:
            _state().pop(group, None)
    return missing


def _abandon(group: tuple[str, ...], reason: str) -> list[str]:
    """The leader gives up: every rank waiting in this generation raises; returns the missing."""
    with _lock:
        arrived = _state().pop(group, {})
    missing = sorted(set(group) - set(arrived))
    for name, fut in arrived.items():
        if not fut.done():
            fut.set_exception(BarrierError(f"{reason} (seen from {name})", missing))
    return missing


def _dead(group: tuple[str, ...]) -> str | None:
    """On the notebook of an nbdist world: a member of the group that has died, described."""
    from .. import cluster

    c = cluster.current()
    if c is None:
        return None
    for rank, info in c.ranks.items():
        if info.name in group and rank != 0 and info.exit_code is not None:
            return f"rank {rank} ({info.name}) {info.reason()}"
    return None


def _group(worker_names_: Iterable[str | int] | None) -> tuple[str, ...]:
    names = _world.worker_names()
    if worker_names_ is None:
        return tuple(names)
    if isinstance(worker_names_, (str, int)):
        worker_names_ = [worker_names_]
    chosen = {names[get_worker_id(w)] for w in worker_names_}
    return tuple(sorted(chosen, key=names.index))


def barrier(worker_names: Iterable[str | int] | None = None,
            timeout: float | None = None) -> None:
    """Block until every worker in ``worker_names`` (default: all ranks) has called ``barrier``.

    Workers are names or ranks and must include this process. ``timeout`` defaults to the
    world's RPC timeout. Raises ``BarrierError`` naming the workers that never arrived, or the
    rank that died; it never returns unless every worker arrived.
    """
    if not rpc_live():
        size = get_world_info().world_size
        if size > 1:
            raise BarrierError(f"no RPC world is running in this process, but WORLD_SIZE={size}; "
                               "start one (`%dist_start N` or `auto_init_rpc`) first")
        return
    group = _group(worker_names)
    me = get_world_info().worker_name
    if me not in group:
        raise ValueError(f"this process ({me}) must be one of the barrier's workers, "
                         f"got {list(group)}")
    if len(group) == 1:
        return
    if timeout is None:
        timeout = float(_rpc.get_rpc_timeout())
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    leader = min(group, key=get_worker_id)
    if me == leader:
        _lead(group, me, timeout)
    else:
        _follow(group, me, leader, timeout)


def _lead(group: tuple[str, ...], me: str, timeout: float) -> None:
    fut = _arrive_now(group, me)
    done = threading.Event()
    fut.add_done_callback(lambda _f: done.set())
    deadline = time.monotonic() + timeout
    what = f"barrier over {', '.join(group)}"
    try:
        while not done.wait(0.05):
            dead = _dead(group)
            if dead is not None:
                missing = _abandon(group, f"{what} failed: {dead}")
                raise BarrierError(f"{what} failed: {dead}", missing)
            if time.monotonic() > deadline:
                reason = f"{what} timed out after {timeout:g}s"
                missing = _abandon(group, reason)
                raise BarrierError(f"{reason}; never arrived: {', '.join(missing)}", missing)
    except KeyboardInterrupt:
        _abandon(group, f"{what} was interrupted on its leader {me}")
        raise
    fut.wait()


def _follow(group: tuple[str, ...], me: str, leader: str, timeout: float) -> None:
    from ..errors import WorkerDiedError
    from ..rpc_hooks import wait_future

    what = f"barrier over {', '.join(group)}"
    fut = _rpc.rpc_async(leader, _arrive, args=(group, me), timeout=timeout)
    try:
        wait_future(fut, leader)
        return
    except WorkerDiedError as exc:
        raise BarrierError(f"{what} failed: {exc}", [leader]) from exc
    except Exception as exc:
        first = str(exc).strip().splitlines()
        reason = first[-1] if first else type(exc).__name__
        cause = exc
    try:
        missing = _rpc.rpc_sync(leader, _withdraw, args=(group, me), timeout=5)
    except Exception:
        missing = []
    tail = f"; never arrived: {', '.join(missing)}" if missing else ""
    raise BarrierError(f"{what} failed on {me} after waiting for leader {leader}: "
                       f"{reason}{tail}", missing) from cause
