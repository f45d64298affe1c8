"""``nbdist.log`` on any rank, and the history the notebook keeps of it.

On a worker, ``log`` appends to an in-memory batch that a background thread sends to the
notebook every 50 ms (one message per batch, not per record), so a tight logging loop costs a
dict and a list append. On the notebook, records go straight into the history. Order per rank
is kept because one thread per rank sends, over one ordered channel.
"""

from __future__ import annotations

import csv
import json
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["clear_history", "export_history", "history", "history_frame", "log", "subscribe",
           "unsubscribe"]

_lock = threading.Lock()
_history: list[dict] = []
_subscribers: list[Callable[[list[dict]], None]] = []
_identity = {"rank": 0, "name": "worker0"}
_steps: dict[int, int] = {}

# worker side
_pending: list[dict] = []
_pending_lock = threading.Lock()
_worker = False
_FLUSH_EVERY = 0.05


def log(step: int | None = None, **values: Any) -> None:
    """Record named values (numbers, usually) from whatever rank runs this.

    ``step`` defaults to a per-rank counter. Values must be picklable; tensors of one element
    are turned into Python numbers.
    """
    if not values:
        raise ValueError("nbdist.log() needs at least one named value, e.g. log(reward=1.5)")
    for key, v in values.items():
        if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
            values[key] = v.item()
    rank = _identity["rank"]
    if step is None:
        step = _steps.get(rank, 0)
    _steps[rank] = step + 1
    rec = {"rank": rank, "name": _identity["name"], "step": step, "time": time.time(), **values}
    if _worker:
        with _pending_lock:
            _pending.append(rec)
    else:
        _deliver([rec])


def _deliver(records: list[dict]) -> None:
    with _lock:
        _history.extend(records)
        subs = list(_subscribers)
    for fn in subs:
        try:
            fn(records)
        except Exception:  # a broken display must not break logging
            pass


def _set_identity(rank: int, name: str) -> None:
    _identity.update(rank=rank, name=name)


def _start_worker_flusher(channel: Any, rank: int, name: str) -> None:
    global _worker
    _worker = True
    _set_identity(rank, name)
    threading.Thread(target=_flush_loop, args=(channel, rank), daemon=True,
                     name="nbdist-metrics").start()


def _take_pending() -> list[dict]:
    with _pending_lock:
        batch = _pending[:]
        _pending.clear()
    return batch


def _flush_loop(channel: Any, rank: int) -> None:
    while True:
        time.sleep(_FLUSH_EVERY)
        flush_worker(channel, rank)


def flush_worker(channel: Any, rank: int) -> None:
    batch = _take_pending()
    if batch:
        try:
            channel.send(("metrics", rank, batch))
        except OSError:
            pass


def history(rank: int | None = None, key: str | None = None) -> list[dict]:
    """Copies of the records received so far, optionally for one rank or one value name."""
    with _lock:
        rows = list(_history)
    if rank is not None:
        rows = [r for r in rows if r["rank"] == rank]
    if key is not None:
        rows = [r for r in rows if key in r]
    return [dict(r) for r in rows]


def history_frame() -> Any:
    """The history as a pandas DataFrame (needs pandas)."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("history_frame() needs pandas: pip install pandas") from exc
    return pd.DataFrame(history())


def clear_history() -> None:
    """Forget every record (the per-rank step counters restart too)."""
    with _lock:
        _history.clear()
    _steps.clear()


def export_history(path: str) -> str:
    """Write the history to ``path``: ``.json`` (a list of records) or ``.csv``."""
    rows = history()
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump(rows, f)
    elif path.endswith(".csv"):
        cols: list[str] = []
        for r in rows:
            cols.extend(k for k in r if k not in cols)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
    else:
        raise ValueError(f"export_history: {path!r} should end in .csv or .json")
    return path


def subscribe(fn: Callable[[list[dict]], None]) -> None:
    """Call ``fn(records)`` from the receiving thread whenever records arrive."""
    with _lock:
        _subscribers.append(fn)


def unsubscribe(fn: Callable[[list[dict]], None]) -> None:
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)
