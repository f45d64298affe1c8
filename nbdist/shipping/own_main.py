"""Each rank has its own ``__main__``; notebook globals are mirrored into it, never forced.

A function shipped from another rank runs against the receiving rank's ``__main__``; the
globals it reads travel with it and are merged name by name (``merge``): a missing name is set,
a name holding the value mirrored last time is replaced when the sender rebound it, and a name
this rank bound itself is kept. A value goes to a destination once per binding, a marker after
that (a receiver waits up to ``WAIT`` seconds for a value it has not seen). Under ``sender_wins``
(``mp.spawn``: a spawned process runs the parent's module as the parent has it) every value
arriving replaces this rank's. docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from .. import world_state

__all__ = ["UNCHANGED", "WAIT", "forget_peers", "main_namespace", "mark_sent", "merge",
           "outgoing", "sender_wins"]

WAIT = 30.0  # seconds a receiver waits for a value a racing request is bringing
_RACE_POLL = 0.001  # seconds between its looks (the race is rare)


class _Unchanged:
    """Marker: the destination already holds the sender's current binding of this name."""

    def __reduce__(self) -> str:
        return "UNCHANGED"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
_MISSING = object()


class _Mirror:
    """This process's own side of mirroring: who it is as a sender, and what it mirrored into
    its namespace (its namespace outlives worlds)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """As new: a forked child is a sender and receiver of its own."""
        self.me = os.urandom(6).hex()  # who sent a value (the receiver keys by it)
        # receiver: name -> the object this rank mirrored into its namespace last
        self.mirrored: dict[str, Any] = {}


class _ValuesInWorld:
    """Which values went where, and came from whom, in this world (a ``world_state`` part:
    a new world's ranks hold none of ours, and its senders are new)."""

    def __init__(self) -> None:
        # sender: (destination, name) -> the object last shipped there (held: its id is the
        # token, so it must not be reused while remembered)
        self.sent: dict[tuple[str, str], Any] = {}
        self.have: set[tuple[str, str]] = set()  # receiver: (sender, name) whose value arrived
        # a C RLock, not a Condition: an interrupt landing in Condition's Python code could
        # leave it held (wake_flag.py); a receiver waiting polls
        self.lock = threading.RLock()


_MIRROR_PER_PROCESS = _Mirror()


def _after_fork() -> None:
    _MIRROR_PER_PROCESS.reset()


os.register_at_fork(after_in_child=_after_fork)


def _world() -> _ValuesInWorld:
    return world_state.part(_ValuesInWorld)


def main_namespace() -> dict:
    """The namespace notebook code runs against in this process."""
    ipython = sys.modules.get("IPython")  # a notebook, or a worker's shell: its user namespace
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        return shell.user_ns
    return sys.modules["__main__"].__dict__


def forget_peers() -> None:
    """Its ranks hold none of our values, and no sender's arrived: as a new world."""
    world = _world()
    world.sent.clear()
    with world.lock:
        world.have.clear()


def outgoing(dest: str | None, g: dict, names: tuple) -> tuple[str, tuple]:
    """The globals a function reads, as (sender, ((name, value or UNCHANGED), ...)): a value
    ``dest`` already holds goes as the marker (``mark_sent`` records what went out)."""
    entries = []
    sent = _world().sent
    for name in names:
        value = g.get(name, _MISSING)
        if value is _MISSING:
            continue
        if dest is not None and sent.get((dest, name), _MISSING) is value:
            entries.append((name, UNCHANGED))
        else:
            entries.append((name, value))
    return _MIRROR_PER_PROCESS.me, tuple(entries)


def mark_sent(dest: str, entries: tuple) -> None:
    """The request that carried ``entries`` to ``dest`` went out: it holds those values."""
    sent = _world().sent
    for name, value in entries:
        if value is not UNCHANGED:
            sent[(dest, name)] = value


#: .on: merges on this thread replace this rank's bindings
_SENDER_WINS_PER_PROCESS = threading.local()


@contextlib.contextmanager
def sender_wins() -> Iterator[None]:
    """Within: every global arriving (on this thread) replaces this rank's binding."""
    _SENDER_WINS_PER_PROCESS.on = True
    try:
        yield
    finally:
        _SENDER_WINS_PER_PROCESS.on = False


def merge(sender: str, entries: tuple, ns: dict) -> None:
    """Apply a sender's globals to ``ns`` by the rule in this module's docstring."""
    if not entries:
        return
    st = _world()
    mirrored = _MIRROR_PER_PROCESS.mirrored
    force = getattr(_SENDER_WINS_PER_PROCESS, "on", False)
    waiting = []
    with st.lock:
        for name, value in entries:
            key = (sender, name)
            if value is UNCHANGED:
                if name not in ns and key not in st.have:
                    waiting.append(key)
                continue
            st.have.add(key)
            current = ns.get(name, _MISSING)
            if force or current is _MISSING or current is mirrored.get(name, _MISSING):
                ns[name] = value
                mirrored[name] = value
            else:
                mirrored.pop(name, None)  # this rank's own binding: never overwritten
    if not waiting:
        return
    give_up = time.monotonic() + WAIT
    for key in waiting:
        while key not in st.have and key[1] not in ns:  # the racing request, polled
            left = give_up - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"nbdist: the notebook global {key[1]!r} never reached "
                                   f"this rank within {WAIT:.0f}s")
            time.sleep(min(left, _RACE_POLL))
