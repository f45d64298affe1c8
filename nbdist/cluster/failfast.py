"""Fail fast in ``%%dist --local`` cells and ``mp.spawn``: the first rank to fail ends the
cell (the spawn) on every rank.

While rank 0 runs its part (on any thread), a watcher looks at the workers' results every
``EVERY`` seconds. When a worker raised or its process ended, rank 0's rendezvous waits give up
(``groups.rendezvous.abandon``), rank 0's own part is interrupted (its KeyboardInterrupt is a
consequence, so it is not shown; one line says why) and so are the other workers' parts.
``run_with_local`` interrupts the workers itself where rank 0 failed first.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ..groups import rendezvous
from ..thread_raise import raise_in

__all__ = ["EVERY", "FailFast"]

EVERY = 0.02  # seconds between two looks at the workers' results


class FailFast:
    """The watcher of one ``--local`` cell; ``first``: the worker that failed first, once one
    has (None until then)."""

    def __init__(self, cluster: Any, exec_id: int, targets: list[int],
                 shell: Any = None) -> None:
        self.cluster, self.exec_id, self.targets, self.shell = cluster, exec_id, targets, shell
        self.first: int | None = None
        self._lock = threading.Lock()
        self._inside = False  # rank 0 is in its part of the cell: it may be interrupted
        self._done = threading.Event()
        self._rank0 = threading.get_ident()

    @contextlib.contextmanager
    def rank0(self) -> Iterator[None]:
        """Around rank 0's part (run on the thread that enters it). With a shell, rank 0's
        traceback is not shown once a worker failed first (the cell shows that failure)."""
        self._rank0 = threading.get_ident()
        if self.shell is None:
            with self._watching():
                yield
            return
        own = "showtraceback" in vars(self.shell)
        shown = self.shell.showtraceback

        def showtraceback(*args: Any, **kwargs: Any) -> Any:
            if self.first is None:  # else rank 0's error is a consequence of the first
                return shown(*args, **kwargs)
            return None

        self.shell.showtraceback = showtraceback
        try:
            with self._watching():
                yield
        finally:
            if own:
                self.shell.showtraceback = shown
            else:
                del self.shell.showtraceback

    @contextlib.contextmanager
    def _watching(self) -> Iterator[None]:
        watcher = threading.Thread(target=self._watch, daemon=True, name="nbdist-fail-fast")
        with self._lock:
            self._inside = True
        watcher.start()
        try:
            yield
        finally:
            with self._lock:
                self._inside = False
            self._done.set()
            watcher.join(1.0)
            rendezvous.resume()

    def say_why(self) -> None:
        """The line that replaces rank 0's interrupted part's traceback."""
        if self.first is not None:
            names = self.cluster.names
            print(f"nbdist: rank 0 ({names[0]}) and the other ranks were interrupted: rank "
                  f"{self.first} ({names[self.first]}) failed first", file=sys.stderr)

    def _watch(self) -> None:
        while not self._done.wait(EVERY):
            rank = self.cluster.first_failure(self.exec_id, self.targets)
            if rank is not None:
                self._fire(rank)
                return

    def _fire(self, rank: int) -> None:
        self.first = rank
        rendezvous.abandon(f"rank {rank} ({self.cluster.names[rank]}) failed")
        others = [r for r in self.cluster.cells.pending(self.exec_id, self.targets)
                  if r != rank]
        self.cluster.cells.interrupt(others)
        with self._lock:
            if self._inside:
                _interrupt(self._rank0)


def _interrupt(thread_id: int) -> None:
    """KeyboardInterrupt in the thread ``thread_id``, as Ctrl-C would in the main one."""
    if thread_id == threading.main_thread().ident and callable(signal.getsignal(signal.SIGINT)):
        signal.pthread_kill(thread_id, signal.SIGINT)
        return
    # another thread, or SIGINT ignored here (a background run): raise it there
    raise_in(thread_id, KeyboardInterrupt)
