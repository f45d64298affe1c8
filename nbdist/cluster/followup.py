"""Interrupts that chase an interrupted RPC until it has ended.

Ctrl-C during ``rpc_sync`` interrupts the RPC functions running on the destination at once.
A call interrupted within milliseconds of being sent may not be running there yet (still on
the wire, or being unpickled), and would then run to its end. So while the interrupted call's
future is not done, the destination is told again every ``EVERY`` seconds (for at most
``LIMIT`` seconds) to interrupt its RPC functions, never its cell. One thread, owned by the
cluster, started on first use and stopped with the world.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["FollowUps"]

EVERY = 0.1
LIMIT = 10.0


class FollowUps:
    """``add(rank, fut)`` after an interrupt; ``send(rank)`` re-interrupts RPC functions."""

    def __init__(self, send: Callable[[int], None]) -> None:
        self._send = send
        self._items: list[tuple[int, Any, float]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def add(self, rank: int, fut: Any) -> None:
        if fut is None or fut.done():
            return
        with self._lock:
            if self._stop:
                return
            self._items.append((rank, fut, time.monotonic() + LIMIT))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="nbdist-interrupt-followup")
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait(EVERY)
            self._wake.clear()
            with self._lock:
                if self._stop:
                    return
                now = time.monotonic()
                self._items = [(r, f, end) for r, f, end in self._items
                               if not f.done() and now < end]
                ranks = sorted({r for r, _, _ in self._items})
            for rank in ranks:
                try:
                    self._send(rank)
                except Exception:  # noqa: BLE001 - a dead rank: its call fails by itself
                    pass

    def stop(self, timeout: float = 1.0) -> None:
        with self._lock:
            self._stop = True
            self._items.clear()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
