"""Destroyed process groups, kept alive until freeing them cannot freeze the process.

Freeing a destroyed Gloo group (``del ddp_model`` after ``destroy_process_group()``) runs a
destructor that joins the group's threads while holding the GIL, which those threads may need, or
that may wait out the group's timeout: the process can freeze for good (pytorch issue 56297).
``bury`` keeps a reference to each destroyed group, so the destructor never runs from whatever
else drops its references; ``release`` lets go of those whose threads are certainly idle: older
than the group's timeout, or, while more than ``CAP`` are kept, older than ``SETTLE`` seconds. The
world calls ``release(everything=True)`` when it ends, after its peers are gone.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CAP", "SETTLE", "bury", "kept", "release"]

SETTLE = 1.0  # seconds after which a group without work in flight has idle threads
CAP = 16  # kept groups beyond which settled ones are freed before their timeout


@dataclass
class _Kept:
    """The destroyed groups this process keeps alive, whatever world made them."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # (group, buried at, its timeout in seconds), oldest first
    entries: list[tuple[Any, float, float]] = field(default_factory=list)


_KEPT_PER_PROCESS = _Kept()


def bury(groups: list[Any], timeout: float) -> None:
    """Keep ``groups`` (being destroyed now) alive until ``release`` finds them safe to free."""
    now = time.monotonic()
    with _KEPT_PER_PROCESS.lock:
        known = {id(g) for g, _, _ in _KEPT_PER_PROCESS.entries}
        _KEPT_PER_PROCESS.entries.extend((g, now, timeout) for g in groups
                                         if g is not None and id(g) not in known)


def kept() -> int:
    """How many destroyed groups are kept now."""
    with _KEPT_PER_PROCESS.lock:
        return len(_KEPT_PER_PROCESS.entries)


def release(everything: bool = False, wait: float = SETTLE) -> int:
    """Free the kept groups that are safe to free now; returns how many.

    ``everything`` (the world ended, its peers are gone, so no collective can wait on them):
    all of them, once each has settled (waiting at most ``wait`` seconds for that).
    """
    if everything:
        with _KEPT_PER_PROCESS.lock:
            newest = max((t for _, t, _ in _KEPT_PER_PROCESS.entries), default=None)
        if newest is None:
            return 0
        time.sleep(min(max(newest + SETTLE - time.monotonic(), 0.0), wait))
        gc.collect()  # a model in a reference cycle lets go of its group now, not at random
    now = time.monotonic()
    with _KEPT_PER_PROCESS.lock:
        entries = _KEPT_PER_PROCESS.entries
        over = len(entries) - CAP
        free, keep = [], []
        for i, (g, at, timeout) in enumerate(entries):  # oldest first
            age = now - at
            if everything or age > timeout + SETTLE or (i < over and age > SETTLE):
                free.append(g)
            else:
                keep.append((g, at, timeout))
        _KEPT_PER_PROCESS.entries = keep
    count = len(free)
    del free  # the destructors run here, on the caller's thread, outside the lock
    return count
