"""``nbdist.log`` on any rank, and the history the notebook keeps of it.

A record is a dict: ``rank``, ``name`` (the rank's RPC name), ``step``, ``time`` (wall clock,
``time.time()`` when logged) and the logged values.

On a worker, ``log`` appends ``(step, time, values)`` to a lock-free ``deque`` (``append`` is
atomic; ``values`` is the call's own keyword dict), and a background thread sends whatever has
accumulated to the notebook every 50 ms as one ``("metrics", rank, batch)`` message, so a tight
logging loop costs about half a microsecond a call. Rank 0 builds the record dicts.
Taking a batch and sending it happen under one lock, and the worker also flushes before it
reports a ``%%dist`` cell's result, so records of one rank arrive in the order they were
logged and before the cell's result. On the notebook (rank 0) records go straight into the
history. Subscribers (``subscribe``) are called with each delivered batch.

Batches also carry *internal* records (a ``"__nbdist__"`` key: RPC traces, benchmark timings);
``_deliver`` hands those to their handler (``register_internal``) and never puts them in the
history.
"""

from __future__ import annotations

import collections
import csv
import json
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "clear_history",
    "export_history",
    "flush_worker",
    "follow",
    "generation",
    "history",
    "history_frame",
    "log",
    "register_internal",
    "send_internal",
    "subscribe",
    "unsubscribe",
]

META = ("rank", "name", "step", "time")
INTERNAL = "__nbdist__"

_lock = threading.Lock()
_history: list[dict] = []
_subscribers: list[Callable[[list[dict]], None]] = []
_internal: dict[str, Callable[[dict], None]] = {}
# internal record kinds and the module that registers a handler for them when imported
_PROVIDERS = {"trace": "nbdist.telemetry.tracing", "timing": "nbdist.telemetry.timing"}
_rank = 0
_name = "worker0"
_generation = 0  # bumped by clear_history, so displays know to start over
_next_step = 0

# worker side
_pending: collections.deque = collections.deque()
_pending_internal: collections.deque = collections.deque()
_send_lock = threading.Lock()
_extra_sources: list[Callable[[], list[dict]]] = []
_worker = False
_FLUSH_EVERY = 0.05
_PLAIN = frozenset((float, int, str, bool, type(None)))
_RESERVED = frozenset(("rank", "name", "time"))
_append = _pending.append
_now = time.time


def log(step: int | None = None, **values: Any) -> None:
    """Record named values (numbers, usually) from whatever rank and thread runs this.

    ``step`` defaults to a per-process counter (one past the last step logged here; give it
    explicitly when several threads log the same series). Values must be picklable; tensors
    and numpy scalars of one element become Python numbers. ``rank``, ``name`` and ``time``
    are reserved names.
    """
    global _next_step
    if not values:
        raise ValueError("nbdist.log() needs at least one named value, e.g. log(reward=1.5)")
    for v in values.values():
        if type(v) not in _PLAIN:
            _convert(values)
            break
    if not _RESERVED.isdisjoint(values):
        raise ValueError(f"nbdist.log(): {sorted(_RESERVED & set(values))} are reserved names; "
                         "pick other names for those values")
    if step is None:
        step = _next_step
    _next_step = step + 1
    if _worker:
        _append((step, _now(), values))  # the kwargs dict is ours: no copy
    else:
        _deliver([_record(_rank, _name, step, _now(), values)])


def _record(rank: int, name: str, step: int, t: float, values: dict) -> dict:
    rec = {"rank": rank, "name": name, "step": step, "time": t}
    rec.update(values)
    return rec


def _convert(values: dict) -> None:
    for key, v in values.items():
        if type(v) not in _PLAIN:
            values[key] = _plain(v)


def _plain(v: Any) -> Any:
    """A one-element tensor or numpy value as a Python number; anything else unchanged."""
    item = getattr(v, "item", None)
    if item is not None:
        try:
            size = v.numel() if hasattr(v, "numel") else getattr(v, "size", 1)
            if size == 1:
                return item()
        except Exception:  # noqa: BLE001 - not a number-like after all
            return v
    return v


def _deliver(records: Any) -> None:
    """Rank 0: add records to the history and tell the subscribers (internal records aside).

    ``records`` is a list of record dicts (internal ones, if any, at its end), or a worker's
    batch as ``flush_worker`` packs it: ``(rank, name, [(step, time, values), ...],
    [internal records])``.
    """
    if type(records) is tuple:
        rank, name, rows, specials = records
        records = [_record(rank, name, s, t, v) for s, t, v in rows]
    elif records and INTERNAL in records[-1]:
        k = len(records)
        while k and INTERNAL in records[k - 1]:
            k -= 1
        records, specials = records[:k], records[k:]
    else:
        specials = ()
    for special in specials:
        handler = _handler(special[INTERNAL])
        if handler is not None:
            try:
                handler(special)
            except Exception:  # noqa: BLE001 - a broken handler must not break logging
                pass
    if not records:
        return
    with _lock:
        _history.extend(records)
        subs = list(_subscribers)
    for fn in subs:
        try:
            fn(records)
        except Exception:  # noqa: BLE001 - a broken display must not break logging
            pass


def _handler(kind: str) -> Callable[[dict], None] | None:
    handler = _internal.get(kind)
    if handler is None and kind in _PROVIDERS:
        import importlib

        importlib.import_module(_PROVIDERS[kind])  # registers itself on import
        handler = _internal.get(kind)
    return handler


def register_internal(kind: str, handler: Callable[[dict], None] | None,
                      source: Callable[[], list[dict]] | None = None) -> None:
    """Route internal records ``{"__nbdist__": kind, ...}`` arriving at rank 0 to ``handler``.

    ``source`` (worker side) is called at every flush and returns internal records to send
    after the batch's ordinary records.
    """
    if handler is not None:
        _internal[kind] = handler
    if source is not None and source not in _extra_sources:
        _extra_sources.append(source)


def send_internal(kind: str, **fields: Any) -> None:
    """Hand ``{"__nbdist__": kind, **fields}`` to rank 0's handler for ``kind`` (from any rank)."""
    rec = {INTERNAL: kind, **fields}
    if _worker:
        _pending_internal.append(rec)
    else:
        _deliver([rec])


def _set_identity(rank: int, name: str) -> None:
    """This process is ``rank`` called ``name`` (rank 0: called when its world is ready)."""
    global _rank, _name
    _rank, _name = rank, name
    from . import tracing

    tracing.arm(rank, name)


def _start_worker_flusher(channel: Any, rank: int, name: str) -> None:
    global _worker
    _worker = True
    _set_identity(rank, name)
    threading.Thread(target=_flush_loop, args=(channel, rank), daemon=True,
                     name="nbdist-metrics").start()


def _flush_loop(channel: Any, rank: int) -> None:
    while True:
        time.sleep(_FLUSH_EVERY)
        flush_worker(channel, rank)


def flush_worker(channel: Any, rank: int) -> None:
    """Send every record logged so far (and internal ones) as one ordered batch."""
    with _send_lock:
        n = len(_pending)
        pop = _pending.popleft
        rows = [pop() for _ in range(n)]
        n = len(_pending_internal)
        pop = _pending_internal.popleft
        specials = [pop() for _ in range(n)]
        for source in _extra_sources:
            try:
                specials.extend(source())
            except Exception:  # noqa: BLE001
                pass
        if rows or specials:
            try:
                channel.send(("metrics", rank, (rank, _name, rows, specials)))
            except OSError:
                pass


def generation() -> int:
    """A number that changes each time ``clear_history`` runs."""
    return _generation


def history(rank: int | None = None, key: str | None = None) -> list[dict]:
    """Copies of the records received so far, optionally for one rank or one value name."""
    with _lock:
        rows = list(_history)
    if rank is not None:
        rows = [r for r in rows if r["rank"] == rank]
    if key is not None:
        rows = [r for r in rows if key in r]
    return [dict(r) for r in rows]


def history_frame(rank: int | None = None, key: str | None = None) -> Any:
    """The history as a pandas DataFrame (needs pandas); same filters as ``history``."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("history_frame() needs pandas: pip install pandas") from exc
    return pd.DataFrame(history(rank, key))


def clear_history() -> None:
    """Forget every record received; rank 0's default step counter restarts at 0.

    A worker's own counter restarts with each new world (give ``step=`` to control it).
    """
    global _next_step, _generation
    with _lock:
        _history.clear()
        _generation += 1
    _next_step = 0


def export_history(path: str) -> str:
    """Write the history to ``path``: ``.json`` (a list of records) or ``.csv``."""
    rows = history()
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump(rows, f)
    elif path.endswith(".csv"):
        cols: list[str] = []
        seen: set[str] = set()
        for r in rows:
            for k in r:
                if k not in seen:
                    seen.add(k)
                    cols.append(k)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    else:
        raise ValueError(f"export_history: {path!r} should end in .csv or .json")
    return path


def subscribe(fn: Callable[[list[dict]], None]) -> None:
    """Call ``fn(records)`` (from the receiving thread, keep it quick) as records arrive."""
    with _lock:
        _subscribers.append(fn)


def follow(fn: Callable[[list[dict]], None]) -> tuple[list[dict], int]:
    """Subscribe ``fn`` and return ``(history so far, generation)`` in one atomic step.

    Every record is then either in the returned history or passed to ``fn`` later, never
    both, never neither. Calling it again for the same ``fn`` starts over.
    """
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)
        _subscribers.append(fn)
        return list(_history), _generation


def unsubscribe(fn: Callable[[list[dict]], None]) -> None:
    """Stop calling ``fn``."""
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)
