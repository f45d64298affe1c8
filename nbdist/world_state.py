"""What describes the world this process is in, as one object: a part per subsystem.

A subsystem keeps its per-world state in a class of its own and reaches it with
``part(Kind)`` (made on first use in a world) or ``peek(Kind)`` (None if not made). ``end()``,
called as this process leaves its world (``proc.membership.leave``), closes every part (its
``close()``, if it has one, newest first: shared memory, the process groups user code made,
tracing...), runs torch's own shutdown and resets it is given, and drops the object: the
next world starts from nothing. A child forked from a rank (a DataLoader worker) is in no
world: its parts' ``in_forked_child()`` run, without locks or peers, and it starts with an
empty object too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["WorldState", "current", "end", "part", "peek"]

T = TypeVar("T")


class WorldState:
    """One world's parts, keyed by their class."""

    def __init__(self) -> None:
        self._parts: dict[type, Any] = {}
        self._lock = threading.Lock()

    def part(self, kind: type[T]) -> T:
        """This world's ``kind`` part, made (``kind()``) on first use."""
        found = self._parts.get(kind)
        if found is None:
            with self._lock:
                found = self._parts.get(kind)
                if found is None:
                    found = self._parts[kind] = kind()
        return found

    def peek(self, kind: type[T]) -> T | None:
        """This world's ``kind`` part, or None if nothing made it."""
        return self._parts.get(kind)

    def close(self) -> None:
        """Close every part, newest first; one that fails does not keep the others open."""
        with self._lock:
            parts, self._parts = list(self._parts.values()), {}
        for p in reversed(parts):
            close = getattr(p, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - a world's end must finish
                    pass


class _WorldOfThisProcess:
    """Which ``WorldState`` is this process's now: one at a time, replaced at a world's end
    and in a forked child."""

    def __init__(self) -> None:
        self.current = WorldState()

    def renew(self) -> WorldState:
        """Start an empty ``WorldState``; returns the one it replaced."""
        old, self.current = self.current, WorldState()
        return old


_WORLD_PER_PROCESS = _WorldOfThisProcess()


def current() -> WorldState:
    """The world this process is in now (an empty one between worlds)."""
    return _WORLD_PER_PROCESS.current


def part(kind: type[T]) -> T:
    """The current world's ``kind`` part, made on first use."""
    return _WORLD_PER_PROCESS.current.part(kind)


def peek(kind: type[T]) -> T | None:
    """The current world's ``kind`` part, or None."""
    return _WORLD_PER_PROCESS.current.peek(kind)


def end(then: Callable[[], None] | None = None) -> None:
    """This process leaves its world: every part closes (newest first), then ``then`` runs
    (torch's own shutdown and resets: what the world made on top of torch ends before torch's
    agent does), then the next world starts empty. A part that something touched during
    ``then`` (an RPC still finishing) belongs to the ended world and closes with it."""
    ended = _WORLD_PER_PROCESS.current
    ended.close()
    try:
        if then is not None:
            then()
    finally:
        if _WORLD_PER_PROCESS.current is ended:
            _WORLD_PER_PROCESS.renew()
        ended.close()


def _after_fork() -> None:
    old = _WORLD_PER_PROCESS.renew()
    for p in old._parts.values():
        forget = getattr(p, "in_forked_child", None)
        if forget is not None:
            forget()


os.register_at_fork(after_in_child=_after_fork)
