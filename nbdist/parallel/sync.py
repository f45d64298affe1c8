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

from .. import world_state
from ..patches import no_rpc
from . import whoami as _world
from .failures import BarrierError
from .whoami import get_worker_id, get_world_info, rpc_live

__all__ = ["barrier"]

try:
    import torch
    import torch.distributed.rpc as _rpc

    _async_execution = _rpc.functions.async_execution
except (ImportError, AttributeError):  # pragma: no cover - torch without RPC
    _rpc = None

    def _async_execution(fn: Any) -> Any:
        return fn

# What a waiting rank's future resolves to. Never an exception: torch hands an exception set on
# an ``async_execution`` future back to the caller as a plain return value.
_OK = ("ok", "", ())

_LOCK_PER_PROCESS = threading.Lock()


class _Arrivals:
    """The leader's arrivals in this world (a ``world_state`` part): group -> name -> the
    future each waits on; a world's end forgets them."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, ...], dict[str, Any]] = {}


def _state() -> dict[tuple[str, ...], dict[str, Any]]:
    """The leader's arrivals in the world this process is in."""
    return world_state.part(_Arrivals).waiting


def _arrive_now(group: tuple[str, ...], name: str) -> Any:
    """Record ``name``'s arrival; the future completes when the whole group has arrived."""
    fut: torch.futures.Future = torch.futures.Future()
    release: list[Any] = []
    with _LOCK_PER_PROCESS:
        arrived = _state().setdefault(group, {})
        if name in arrived:
            fut.set_result(("failed", f"{name} reached the barrier twice", ()))
            return fut
        arrived[name] = fut
        if set(arrived) == set(group):
            release = list(_state().pop(group).values())
    for f in release:
        f.set_result(_OK)
    return fut


@_async_execution
def _arrive(group: tuple[str, ...], name: str) -> Any:
    """RPC target on the leader (async: holds no thread while it waits)."""
    return _arrive_now(group, name)


def _withdraw(group: tuple[str, ...], name: str) -> list[str] | None:
    """Take back ``name``'s arrival after it gave up; returns who had not arrived (None when
    ``name`` was no longer waiting: the generation completed or was abandoned)."""
    with _LOCK_PER_PROCESS:
        arrived = _state().get(group)
        if arrived is None or name not in arrived:
            return None
        missing = sorted(set(group) - set(arrived))
        del arrived[name]
        if not arrived:
            _state().pop(group, None)
    return missing


def _abandon(group: tuple[str, ...], reason: str) -> list[str]:
    """The leader gives up: every rank waiting in this generation raises; returns the missing."""
    with _LOCK_PER_PROCESS:
        arrived = _state().pop(group, {})
    missing = sorted(set(group) - set(arrived))
    for fut in arrived.values():
        if not fut.done():
            fut.set_result(("failed", f"{reason}; never arrived: {', '.join(missing)}",
                            tuple(missing)))
    return missing


def _dead(group: tuple[str, ...]) -> str | None:
    """On the notebook of an nbdist world: a member of the group that has died, described."""
    from ..cluster import core as cluster

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
    no_rpc.check("nbdist.parallel.barrier")
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
                missing = _abandon(group, dead)
                raise BarrierError(f"{what} failed: {dead}", missing)
            if time.monotonic() > deadline:
                missing = _abandon(group, f"its leader {me} timed out after {timeout:g}s")
                raise BarrierError(f"{what} timed out after {timeout:g}s; never arrived: "
                                   f"{', '.join(missing)}", missing)
    except KeyboardInterrupt:
        _abandon(group, f"its leader {me} was interrupted")
        raise
    status, reason, missing = fut.wait()
    if status != "ok":
        raise BarrierError(f"{what} failed: {reason}", list(missing))


def _follow(group: tuple[str, ...], me: str, leader: str, timeout: float) -> None:
    from ..errors import WorkerDiedError
    from ..patches.rpc_hooks import wait_future

    what = f"barrier over {', '.join(group)}"
    fut = _rpc.rpc_async(leader, _arrive, args=(group, me), timeout=timeout)
    try:
        status, reason, missing = wait_future(fut, leader)
        if status == "ok":
            return
        raise BarrierError(f"{what} failed on {me}: {reason}", list(missing))
    except BarrierError:
        raise
    except WorkerDiedError as exc:
        raise BarrierError(f"{what} failed: {exc}", [leader]) from exc
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        reason = lines[-1].strip() if lines else type(exc).__name__
        cause = exc
    try:
        missing = _rpc.rpc_sync(leader, _withdraw, args=(group, me), timeout=10)
    except Exception:  # the leader is gone or hung: say what we know
        missing = None
    if missing is None:  # the generation ended meanwhile: the reply was lost or late
        raise BarrierError(f"{what} failed on {me} while waiting for its leader {leader}: "
                           f"{reason}", []) from cause
    tail = f"; never arrived: {', '.join(missing)}" if missing else ""
    raise BarrierError(f"{what} failed on {me} while waiting for its leader {leader}: "
                       f"{reason}{tail}", missing) from cause
