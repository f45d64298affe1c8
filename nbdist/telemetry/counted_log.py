"""A thread-safe list of records with a counter that changes at every change.

The dashboard redraws a plot when its log's ``changes()`` moved; ``events`` and ``timing`` keep
theirs in one each (per process: the notebook's records outlive worlds).
"""

from __future__ import annotations

import collections
import threading

__all__ = ["CountedLog"]


class CountedLog:
    """Records in order (the oldest dropped beyond ``keep``, if given) and a change count."""

    def __init__(self, keep: int | None = None) -> None:
        self._items: collections.deque = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._version = 0

    def add(self, item: dict) -> None:
        with self._lock:
            self._items.append(item)
            self._version += 1

    def changes(self) -> int:
        """A number that moves whenever a record is added or the log cleared."""
        return self._version

    def items(self) -> list[dict]:
        """Copies of the records, oldest first."""
        with self._lock:
            return [dict(i) for i in self._items]

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._items.clear()
            self._version += 1
