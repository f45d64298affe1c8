"""``--heal``: a rank that dies is replaced on its own, the others keeping their state.

One thread per healing world, owned by its ``Cluster``: a death wakes it, it waits a moment
for the deaths that come together (a host lost, an OOM killer's round), then asks the cluster
to restart keeping every live rank. A rank that died ``LIMIT`` times within ``WINDOW`` seconds
is not replaced again: torch's RPC world has a fixed size, so healing stops for the world and
says why (no crash loop); ``%dist_restart --keep`` is the way on once the cause is fixed.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

__all__ = ["Healer"]

LIMIT = 3  # deaths of one rank ...
WINDOW = 60.0  # ... within this many seconds: healing stops
SETTLE = 0.05  # seconds to wait for deaths that come with the first


class Healer:
    """Calls ``heal(ranks)`` on its own thread after ranks die; ``stop`` ends it.

    ``say`` writes one line to the notebook; ``label`` names a rank in it.
    """

    def __init__(self, heal: Callable[[list[int]], None], say: Callable[[str], None],
                 label: Callable[[int], str], limit: int = LIMIT,
                 window: float = WINDOW) -> None:
        self._heal, self._say, self._label = heal, say, label
        self.limit, self.window = limit, window
        self._deaths: dict[int, collections.deque] = {}
        self._pending: set[int] = set()
        self._cv = threading.Condition()
        self._stopping = False
        self.gave_up: int | None = None  # the rank that died too often, once healing stopped
        self.healed = 0  # how many heals ran
        self._thread = threading.Thread(target=self._loop, daemon=True, name="nbdist-heal")
        self._thread.start()

    def died(self, rank: int) -> None:
        """A rank of the running world exited (called from a launcher's reader thread)."""
        now = time.monotonic()
        with self._cv:
            if self._stopping or self.gave_up is not None:
                return
            times = self._deaths.setdefault(rank, collections.deque())
            times.append(now)
            while times and now - times[0] > self.window:
                times.popleft()
            if len(times) >= self.limit:
                self.gave_up = rank
                self._pending.clear()
                self._say(f"nbdist: {self._label(rank)} died {len(times)} times in "
                          f"{self.window:g}s; --heal stops replacing ranks in this world. "
                          f"Look at `%dist_logs {rank}`, fix the cause, then "
                          "`%dist_restart --keep`")
                return
            self._pending.add(rank)
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
            time.sleep(SETTLE)
            with self._cv:
                if self._stopping or not self._pending:
                    continue
                ranks = sorted(self._pending)
                self._pending.clear()
            try:
                self._heal(ranks)
                self.healed += 1
            except Exception as exc:  # noqa: BLE001 - said in the notebook; the thread goes on
                self._say(f"nbdist: --heal could not replace rank"
                          f"{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: "
                          f"{exc}")

    def stop(self, timeout: float = 5.0) -> None:
        """No more heals; waits for one under way unless called from the healing thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
