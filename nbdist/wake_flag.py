"""A flag one thread sleeps on and any thread sets, safe where interrupts land.

``threading.Event`` is Python code over a ``Condition``: a ``KeyboardInterrupt`` that lands
inside its ``set()`` (a Ctrl-C, or an interrupt nbdist raises in an RPC function that prints
or logs) can leave the condition's lock held, and every later ``set()`` and ``wait()`` then
blocks for good. ``WakeFlag`` is one C lock used as a binary semaphore, as the control
channel's writer is woken: each step is one C call, so an interrupt lands before or after it,
never inside, and holds nothing.
"""

from __future__ import annotations

import threading

__all__ = ["WakeFlag"]


class WakeFlag:
    """Set by anyone (``set``), taken by one sleeper (``wait`` clears it as it wakes)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # held: not set

    def set(self) -> None:
        """Wake the sleeper, or have its next ``wait`` return at once."""
        try:
            self._lock.release()
        except RuntimeError:  # already set
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until set (or ``timeout`` seconds); True if it was set. Clears it."""
        if timeout is None:
            return self._lock.acquire()
        return self._lock.acquire(timeout=max(timeout, 0.0))

    def clear(self) -> None:
        """Not set any more (a ``set`` already consumed is not undone)."""
        self._lock.acquire(blocking=False)

    def is_set(self) -> bool:
        """Whether a ``set`` is waiting to be taken."""
        return not self._lock.locked()
