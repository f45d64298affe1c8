"""pdb on a worker, typed at in the notebook: post-mortem of the last failure, ``breakpoint()``.

A ``RemotePdb`` reads and writes through the control channel: what pdb writes is buffered and
sent with each prompt (``DebugPrompt``); the line typed in the notebook comes back as
``DebugInput`` (None: quit). A breakpoint first asks whether the notebook attends (a cell or
an RPC of it is running); if nobody answers within ``ATTEND_WAIT`` seconds, or the notebook
says no, the breakpoint is logged and skipped, never a hang. ``PYTHONBREAKPOINT=0`` turns
breakpoints off, as in Python.
"""

from __future__ import annotations

import bdb
import io
import itertools
import os
import pdb
import queue
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from ..control.protocol import DebugEnd, DebugPrompt, Message

__all__ = ["ATTENDING", "Debugger", "RemotePdb"]

ATTEND_WAIT = 3.0  # seconds a breakpoint waits to learn whether the notebook attends
# The notebook's first answer to a breakpoint when it will serve it: from then on the worker
# waits for the typed line as long as the user takes (a human, or a session of another rank
# served first, often takes longer than ATTEND_WAIT).
ATTENDING = "\x00nbdist: attending"


_REFUSED = object()


class _ChannelIO(io.TextIOBase):
    """pdb's stdin and stdout: writes are buffered; ``readline`` sends them and waits."""

    def __init__(self, debugger: Debugger, session: int, first: bool) -> None:
        self.debugger, self.session = debugger, session
        self.buf: list[str] = []
        self.first = first
        self.prompt = ""

    def write(self, s: str) -> int:
        self.buf.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def readline(self, size: int = -1) -> str:  # noqa: ARG002 - pdb reads whole lines
        text = "".join(self.buf)
        self.buf.clear()
        if self.prompt and text.endswith(self.prompt):
            text = text[: -len(self.prompt)]
        line = self.debugger.ask(self.session, text, self.prompt, self.first)
        if line is _REFUSED:
            sys.stderr.write(f"nbdist: {text.strip()} skipped: no notebook cell is waiting on "
                             "this rank (breakpoints work inside %%dist cells and RPCs the "
                             "notebook is waiting for)\n")
            self.buf.clear()
            return "c\n"
        self.first = False
        return "q\n" if line is None else f"{line}\n"


class RemotePdb(pdb.Pdb):
    """A pdb whose terminal is the notebook's input box; ``on_done`` when it lets go."""

    def __init__(self, io_: _ChannelIO, label: str, on_done: Callable[[], None]) -> None:
        super().__init__(stdin=io_, stdout=io_, nosigint=True, readrc=False)
        self.use_rawinput = False
        self.prompt = io_.prompt = f"(Pdb {label}) "
        self._on_done = on_done

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:
            self._on_done()

    def set_quit(self) -> None:
        super().set_quit()
        self._on_done()


class Debugger:
    """One per worker: the last failure, open sessions, and the breakpoint hook."""

    def __init__(self, rank: int, name: str, send: Callable[[Message], None]) -> None:
        self.rank, self.name, self.send = rank, name, send
        self.last: tuple[BaseException, TracebackType | None] | None = None
        self._answers: dict[int, queue.Queue] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one session at a time on this rank

    # -- the conversation ---------------------------------------------------------------------
    def ask(self, session: int, text: str, prompt: str, first: bool) -> Any:
        """Send what pdb wrote, wait for the notebook's line (None: quit; ``_REFUSED``)."""
        answers = self._answers[session]
        self.send(DebugPrompt(self.rank, session, text, prompt, first))
        if not first:
            return answers.get()
        try:
            line = answers.get(timeout=ATTEND_WAIT)
        except queue.Empty:
            return _REFUSED
        if line == ATTENDING:
            line = answers.get()
        return _REFUSED if line is None else line

    def answer(self, session: int, line: str | None) -> None:
        """``DebugInput`` arrived (from the worker's reader thread)."""
        answers = self._answers.get(session)
        if answers is not None:
            answers.put(line)

    def end_all(self) -> None:
        """Quit every open session (the notebook interrupted or is going away)."""
        for answers in list(self._answers.values()):
            answers.put(None)

    # -- sessions -----------------------------------------------------------------------------
    def remember(self, exc: BaseException, tb: TracebackType | None) -> None:
        """The last unhandled exception of a cell or of an RPC this rank served."""
        self.last = (exc, tb)

    def _open(self, first: bool, banner: str) -> tuple[RemotePdb, Callable[[], None]]:
        self._lock.acquire()
        session = next(self._ids)
        self._answers[session] = queue.Queue()
        io_ = _ChannelIO(self, session, first)
        io_.write(banner)
        done = threading.Event()

        def close() -> None:
            if done.is_set():
                return
            done.set()
            try:
                self.send(DebugEnd(self.rank, session, "".join(io_.buf)))
            except Exception:  # noqa: BLE001 - the channel may be gone
                pass
            finally:
                self._answers.pop(session, None)
                self._lock.release()

        return RemotePdb(io_, self.name, close), close

    def post_mortem(self) -> None:
        """A session in the frame where the last failure happened."""
        if self.last is None or self.last[1] is None:
            raise RuntimeError(f"rank {self.rank} ({self.name}) has no failure to debug: no "
                               "cell or RPC it ran has raised yet")
        exc, tb = self.last
        dbg, close = self._open(False, f"{type(exc).__name__}: {exc}\n")
        try:
            dbg.reset()
            dbg.interaction(None, tb)
        except bdb.BdbQuit:
            pass
        finally:
            close()

    def set_trace(self, frame: FrameType | None = None, *_: Any, **__: Any) -> None:
        """``breakpoint()`` and ``pdb.set_trace()`` on this worker."""
        if os.environ.get("PYTHONBREAKPOINT") == "0":
            return
        frame = frame or sys._getframe(1)
        where = f"breakpoint at {frame.f_code.co_filename}:{frame.f_lineno}"
        dbg, close = self._open(True, where + "\n")
        try:
            dbg.set_trace(frame)
        except BaseException:
            close()
            raise
