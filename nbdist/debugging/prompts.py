"""Debug sessions of worker ranks, served in the notebook's input box.

Prompts from a worker's pdb arrive on the receiver thread and wait here; the notebook's main
thread serves them while it waits anyway (a ``%%dist`` cell, an ``rpc_sync``, ``%dist_debug``),
one session at a time, each prompt labelled with the rank: the text pdb wrote is printed and
``input()`` (Jupyter's stdin request in a kernel) asks for the next line. Ctrl-C at a prompt
ends the session (the worker quits pdb) and interrupts as usual. A breakpoint hit while the
notebook waits on nothing is refused at once; the worker logs it and goes on.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from ..control.protocol import DebugEnd, DebugInput, DebugPrompt
from ..rank_info import RankInfo
from .remote_pdb import ATTENDING

__all__ = ["DebugDesk"]

ATTENDING_GRACE = 0.5  # seconds since the main thread last looked that still count as waiting


class DebugDesk:
    """Queues worker debug prompts and serves them from the main thread."""

    def __init__(self, ranks: dict[int, RankInfo],
                 send: Callable[[int, DebugInput], bool]) -> None:
        self.ranks, self._send = ranks, send
        self._inbox: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._waiting = 0  # main-thread waits in progress
        self._looked = 0.0  # when the main thread last looked for prompts
        self._serving = False
        self._confirmed: set[tuple[int, int]] = set()  # (rank, session) told ATTENDING

    # -- receiver thread ----------------------------------------------------------------------
    def arrived(self, msg: DebugPrompt | DebugEnd) -> None:
        """A prompt or an end from a worker; a breakpoint nobody waits for is refused."""
        if isinstance(msg, DebugPrompt) and msg.first and not self.attending():
            self._send(msg.rank, DebugInput(msg.session, None))
            return
        if isinstance(msg, DebugPrompt) and msg.first and self._waiting > 0:
            self._confirm(msg)  # a serving wait is in progress: it will be served
        self._inbox.append(msg)

    def _confirm(self, msg: DebugPrompt) -> None:
        """Tell the worker its breakpoint will be served (once per session)."""
        with self._lock:
            if (msg.rank, msg.session) in self._confirmed:
                return
            self._confirmed.add((msg.rank, msg.session))
        self._send(msg.rank, DebugInput(msg.session, ATTENDING))

    def has_prompts(self) -> bool:
        return bool(self._inbox)

    def attending(self) -> bool:
        return self._waiting > 0 or time.monotonic() - self._looked < ATTENDING_GRACE

    # -- main thread --------------------------------------------------------------------------
    def waiting(self) -> _Waiting:
        """``with desk.waiting():`` around a main-thread wait that calls ``serve``."""
        return _Waiting(self)

    def serve(self) -> None:
        """Serve every session waiting now (called from main-thread waits, often)."""
        self._looked = time.monotonic()
        if self._serving or threading.current_thread() is not threading.main_thread():
            return
        self._serving = True
        try:
            while self._inbox:
                first = self._inbox.popleft()
                if isinstance(first, DebugPrompt):
                    self._session(first)
        finally:
            self._serving = False

    def _session(self, prompt: DebugPrompt) -> None:
        rank, session = prompt.rank, prompt.session
        info = self.ranks[rank]
        msg: DebugPrompt | DebugEnd = prompt
        if prompt.first:  # queued in a grace window: it is served now
            self._confirm(prompt)
        while True:
            if isinstance(msg, DebugEnd):
                if msg.text.strip():
                    print(_label(info.name, msg.text), end="")
                return
            if msg.text:
                print(_label(info.name, msg.text), end="")
            try:
                line = input(msg.prompt or f"(Pdb {info.name}) ")
            except KeyboardInterrupt:
                self._send(rank, DebugInput(session, None))
                raise
            except EOFError:
                line = None
            self._send(rank, DebugInput(session, line))
            nxt = self._next(rank, session)
            if nxt is None:
                print(f"[{info.name}] the debug session ended: {info.reason()}")
                return
            msg = nxt

    def _next(self, rank: int, session: int) -> DebugPrompt | DebugEnd | None:
        """The next message of this session (others stay queued); None if the rank died."""
        info = self.ranks[rank]
        while True:
            self._looked = time.monotonic()
            for msg in list(self._inbox):
                if msg.rank == rank and msg.session == session:
                    self._inbox.remove(msg)
                    return msg
            if not info.alive:
                return None
            time.sleep(0.005)


class _Waiting:
    def __init__(self, desk: DebugDesk) -> None:
        self.desk = desk

    def __enter__(self) -> None:
        self.desk._waiting += 1

    def __exit__(self, *exc: object) -> None:
        self.desk._waiting -= 1


def _label(name: str, text: str) -> str:
    lines = text.splitlines(True)
    return "".join(f"[{name}] {line}" for line in lines)
