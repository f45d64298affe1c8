"""World events on rank 0's clock: restarts that kept state and heals, for the dashboard.

Each is ``{"kind", "text", "time"}`` (``time.time()``); the list is bounded and outlives
worlds, like ``nbdist.history()``.
"""

from __future__ import annotations

import time

from .counted_log import CountedLog

__all__ = ["clear", "event", "events", "generation"]

MAX_EVENTS = 200
_EVENTS_PER_PROCESS = CountedLog(keep=MAX_EVENTS)


def event(kind: str, text: str) -> None:
    """Record that ``kind`` (``restart``, ``heal``) happened now, described by ``text``."""
    _EVENTS_PER_PROCESS.add({"kind": kind, "text": text, "time": time.time()})


def events() -> list[dict]:
    """The events so far, oldest first."""
    return _EVENTS_PER_PROCESS.items()


generation = _EVENTS_PER_PROCESS.changes  # moves at each event (the dashboard redraws)
clear = _EVENTS_PER_PROCESS.clear
