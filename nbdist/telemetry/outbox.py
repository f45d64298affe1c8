"""A worker's outbox of logged records: the queue ``log`` appends to and the thread that
sends it to the notebook.

``log`` appends ``(step, time, values)`` to a ``deque`` (atomic, no lock) and a background
thread sends what accumulated 50 ms after the first record into an empty queue (``wake``), at
most ``BATCH_ROWS`` rows a batch. While nothing is logged it wakes once a second, for the
sources (``add_source``) that did not wake it (256 idle ranks woken 20 times a second each
cost the machine a fifth of a core). Taking a batch
and sending it happen under one lock, and the worker flushes before it reports a ``%%dist``
cell's result, so one rank's records arrive in order and before the cell's result. Internal
records (RPC traces, timings) ride at the end of a batch. One state object: ``_Outbox``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from ..wake_flag import WakeFlag
from .values import PLAIN, Opaque

__all__ = ["BATCH_ROWS", "add_source", "flush_worker", "pending_count", "queue",
           "queue_internal", "rows", "sent", "start", "wake"]

BATCH_ROWS = 20_000  # rows per metrics message
_FLUSH_EVERY = 0.05
_IDLE_POLL = 1.0  # seconds between flushes while nothing woke the flusher


class _Outbox:
    """What a worker has logged and not yet sent: one per process."""

    def __init__(self) -> None:
        self.rows: collections.deque = collections.deque()
        self.internal: collections.deque = collections.deque()
        self.lock = threading.Lock()  # taking a batch and sending it
        self.sources: list[Callable[[], list[dict]]] = []  # more internal records, per flush
        self.sent = 0  # rows the flusher has taken so far (log() watches it while it waits)
        self.name = "worker"
        # something was queued into an empty queue; not an Event: log() interrupted inside
        # Event.set() left its lock held and hung every later log() (wake_flag.py)
        self.woken = WakeFlag()


_OUTBOX_PER_PROCESS = _Outbox()

#: The rows logged and not yet sent (the deque itself, never replaced), and
#: ``queue((step, time, values))``: what ``log`` calls on a worker (its atomic append).
rows = _OUTBOX_PER_PROCESS.rows
queue = rows.append


def pending_count() -> int:
    """Rows logged here and not yet taken by the flusher."""
    return len(_OUTBOX_PER_PROCESS.rows)


def sent() -> int:
    """Rows the flusher has taken so far."""
    return _OUTBOX_PER_PROCESS.sent


def wake() -> None:
    """Have the flusher send soon (``log`` calls it when it queues into an empty queue)."""
    _OUTBOX_PER_PROCESS.woken.set()


def queue_internal(rec: dict) -> None:
    """An internal record, sent after the next batch's ordinary ones."""
    _OUTBOX_PER_PROCESS.internal.append(rec)
    _OUTBOX_PER_PROCESS.woken.set()


def add_source(source: Callable[[], list[dict]]) -> None:
    """``source()`` is called at every flush; the internal records it returns are sent too."""
    if source not in _OUTBOX_PER_PROCESS.sources:
        _OUTBOX_PER_PROCESS.sources.append(source)


def start(channel: Any, rank: int, name: str) -> None:
    """Send what is logged here through ``channel`` every 50 ms, from a thread of its own.

    Where ``channel`` can ``drain``, the thread waits (up to 5 s) until a batch is written, so
    records pile up here, bounded by ``log``, not in the channel's queue.
    """
    _OUTBOX_PER_PROCESS.name = name
    threading.Thread(target=_flush_loop, args=(channel, rank), daemon=True,
                     name="nbdist-metrics").start()


def _flush_loop(channel: Any, rank: int) -> None:
    """Wait to be woken (or ``_IDLE_POLL``), let more come for ``_FLUSH_EVERY``, send it all;
    what was queued while it sent, into a queue that was not empty, goes next round."""
    drain = getattr(channel, "drain", None)
    box = _OUTBOX_PER_PROCESS
    while True:
        if not (box.rows or box.internal):
            box.woken.wait(_IDLE_POLL)
        else:
            box.woken.clear()
        time.sleep(_FLUSH_EVERY)
        try:
            flush_worker(channel, rank)
            if drain is not None:
                drain(5.0)
        except BaseException:  # noqa: BLE001 - the flusher must outlive anything it meets
            time.sleep(_FLUSH_EVERY)


def _take(q: collections.deque, n: int) -> list:
    pop = q.popleft
    return [pop() for _ in range(n)]


def _specials() -> list[dict]:
    specials = _take(_OUTBOX_PER_PROCESS.internal, len(_OUTBOX_PER_PROCESS.internal))
    for source in _OUTBOX_PER_PROCESS.sources:
        try:
            specials.extend(source())
        except Exception:  # noqa: BLE001
            pass
    return specials


def flush_worker(channel: Any, rank: int) -> None:
    """Send every record logged so far (and internal ones) in order, in one or more batches."""
    box = _OUTBOX_PER_PROCESS
    with box.lock:
        left = len(box.rows)
        while True:
            n = min(left, BATCH_ROWS)
            rows = _take(box.rows, n)
            left -= n
            box.sent += n
            specials = _specials() if left == 0 else []
            if rows or specials:
                _send_batch(channel, (rank, box.name, rows, specials))
            if left == 0:
                return


def _send_batch(channel: Any, batch: tuple) -> None:
    """One metrics message; a batch that cannot be encoded is sent again value by value."""
    try:
        _send(channel, batch)
    except OSError:
        pass  # the notebook is gone: nobody to tell
    except Exception:  # noqa: BLE001 - a value that cannot cross: send its repr instead
        r, name, rows, specials = batch
        rows = [(s, t, {k: v if type(v) in PLAIN or type(v) is Opaque else Opaque.wrap(v)
                        for k, v in values.items()}) for s, t, values in rows]
        try:
            _send(channel, (r, name, rows, specials))
        except Exception:  # noqa: BLE001 - still not: drop this batch, keep the flusher
            pass


def _send(channel: Any, batch: tuple) -> None:
    # ``channel`` is the worker's metrics outbox (proc.worker): it wraps the batch in the
    # protocol's Metrics message; telemetry sits below proc and does not import it
    channel.send(batch)
