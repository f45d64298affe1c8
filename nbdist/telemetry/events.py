"""World events on rank 0's clock: restarts that kept state and heals, for the dashboard.

Each is ``{"kind", "text", "time"}`` (``time.time()``); the list is bounded and outlives
worlds, like ``nbdist.history()``.
"""

from __future__ import annotations

import collections
import threading
import time

__all__ = ["clear", "event", "events", "generation"]

MAX_EVENTS = 200
_events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
_lock = threading.Lock()
_generation = 0


def event(kind: str, text: str) -> None:
    """Record that ``kind`` (``restart``, ``heal``) happened now, described by ``text``."""
    global _generation
    with _lock:
        _events.append({"kind": kind, "text": text, "time": time.time()})
        _generation += 1


def events() -> list[dict]:
    """The events so far, oldest first."""
    with _lock:
        return list(_events)


def generation() -> int:
    """Changes whenever an event is recorded (the dashboard redraws then)."""
    return _generation


def clear() -> None:
    global _generation
    with _lock:
        _events.clear()
        _generation += 1
