"""``nbdist.log`` on any rank: what this process is, and where its records go.

On rank 0 a record goes straight into the history (``history``); on a worker it goes to the
outbox (``outbox``), whose thread sends it to the notebook. The queue is bounded
(``MAX_PENDING``): when it is full, ``log`` waits for the flusher (back-pressure) instead of
dropping records. A record's shape and how its values travel: ``values``.

Internal records (a ``"__nbdist__"`` key: RPC traces, benchmark timings) are sent with
``send_internal`` and reach the handler their kind registered (``register_internal``); they
never enter the history. This module also re-exports the history's reading side, which the
package's API and the displays use.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import history as _history, outbox
from .history import (
    Table,
    deliver,
    export_history,
    follow,
    follow_with,
    generation,
    history,
    history_frame,
    record_count,
    subscribe,
    unsubscribe,
)
from .outbox import flush_worker
from .values import INTERNAL, META, PLAIN, Opaque, plain, record

__all__ = [
    "INTERNAL",
    "MAX_PENDING",
    "META",
    "Opaque",
    "Table",
    "clear_history",
    "deliver",
    "export_history",
    "flush_worker",
    "follow",
    "follow_with",
    "generation",
    "history",
    "history_frame",
    "identity",
    "is_worker",
    "log",
    "record_count",
    "register_internal",
    "send_internal",
    "set_identity",
    "start_worker_flusher",
    "subscribe",
    "unsubscribe",
]

MAX_PENDING = 100_000  # records a worker holds before log() waits for the flusher
STALL_SECONDS = 5.0  # log() stops waiting when the flusher made no progress for this long

_RESERVED = frozenset(("rank", "name", "time"))
_now = time.time
_rows, _queue, _wake = outbox.rows, outbox.queue, outbox.wake  # log()'s hot path on a worker


class _Me:
    """Who logs here (rank 0 until a worker's start says otherwise)."""

    __slots__ = ("name", "next_step", "rank", "worker")

    def __init__(self) -> None:
        self.rank, self.name, self.worker = 0, "worker0", False
        self.next_step = 0  # log()'s default step


_ME_PER_PROCESS = _Me()  # one per process


def log(step: int | None = None, **values: Any) -> None:
    """Record named values (numbers, usually) from whatever rank and thread runs this.

    ``step`` defaults to a per-process counter (one past the last step logged here; give it
    explicitly when several threads log the same series). Tensors and numpy scalars of one
    element become Python numbers; other values that are not plain data reach the notebook
    as themselves when they can be pickled and rebuilt there, else as their ``repr``.
    ``rank``, ``name`` and ``time`` are reserved names.
    """
    if not values:
        raise ValueError("nbdist.log() needs at least one named value, e.g. log(reward=1.5)")
    me = _ME_PER_PROCESS
    for v in values.values():
        if type(v) not in PLAIN:
            _convert(values, me.worker)
            break
    if not _RESERVED.isdisjoint(values):
        raise ValueError(f"nbdist.log(): {sorted(_RESERVED & set(values))} are reserved names; "
                         "pick other names for those values")
    if step is None:
        step = me.next_step
    elif type(step) is not int:
        step = int(step)
    me.next_step = step + 1
    if me.worker:
        pending = len(_rows)
        if pending >= MAX_PENDING:
            _wait_for_room()
        _queue((step, _now(), values))  # the kwargs dict is ours: no copy
        if not pending:
            _wake()  # the flusher sleeps while the queue is empty
    else:
        deliver([record(me.rank, me.name, step, _now(), values)])


def _wait_for_room() -> None:
    """Back-pressure: sleep until the flusher took rows, giving up only when it stalls."""
    seen, stalled_at = outbox.sent(), time.monotonic()
    while outbox.pending_count() >= MAX_PENDING:
        time.sleep(0.002)
        if outbox.sent() != seen:
            seen, stalled_at = outbox.sent(), time.monotonic()
        elif time.monotonic() - stalled_at > STALL_SECONDS:
            return  # the flusher is stuck (the notebook is gone?): keep the record anyway


def _convert(values: dict, worker: bool) -> None:
    for key, v in values.items():
        if type(v) not in PLAIN:
            v = plain(v)
            if worker and type(v) not in PLAIN:
                v = Opaque.wrap(v)
            values[key] = v


def register_internal(kind: str, handler: Callable[[dict], None] | None,
                      source: Callable[[], list[dict]] | None = None) -> None:
    """Route internal records ``{"__nbdist__": kind, ...}`` arriving at rank 0 to ``handler``.

    ``source`` (worker side) is called at every flush and returns internal records to send
    after the batch's ordinary records.
    """
    if handler is not None:
        _history.register_handler(kind, handler)
    if source is not None:
        outbox.add_source(source)


def send_internal(kind: str, **fields: Any) -> None:
    """Hand ``{"__nbdist__": kind, **fields}`` to rank 0's handler for ``kind`` (from any rank)."""
    rec = {INTERNAL: kind, **fields}
    if _ME_PER_PROCESS.worker:
        outbox.queue_internal(rec)
    else:
        deliver([rec])


def identity() -> tuple[int, str]:
    """``(rank, name)`` of this process, as the records it logs carry them."""
    return _ME_PER_PROCESS.rank, _ME_PER_PROCESS.name


def is_worker() -> bool:
    """Whether this process is a worker rank (its records go to the notebook)."""
    return _ME_PER_PROCESS.worker


def set_identity(rank: int, name: str) -> None:
    """This process is ``rank`` called ``name`` (rank 0: called when its world is ready)."""
    _ME_PER_PROCESS.rank, _ME_PER_PROCESS.name = rank, name


def start_worker_flusher(channel: Any, rank: int, name: str) -> None:
    """Worker: this process is ``rank``; from now on ``log`` queues records and a thread sends
    them through ``channel`` every 50 ms."""
    _ME_PER_PROCESS.worker = True
    set_identity(rank, name)
    outbox.start(channel, rank, name)


def clear_history() -> None:
    """Forget every record received; rank 0's default step counter restarts at 0.

    A worker's own counter restarts with each new world (give ``step=`` to control it).
    """
    _history.clear()
    _ME_PER_PROCESS.next_step = 0
