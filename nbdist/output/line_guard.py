"""The notebook's own unfinished line stays whole: nbdist's lines go after it, never inside.

``print(x)`` on rank 0 writes ``x`` and then ``"\\n"`` in two calls, and the thread that shows
the workers' output may write between them: ``rank 0 done[worker2] rank 2 done``. The kernel's
stream is wrapped (``watch``, each cell) so that it knows whether the notebook's text ends
mid-line and which thread left it so; ``write_after`` waits a moment (``WAIT``) for another
thread's line to end, the newline of a ``print`` follows at once, and otherwise starts
nbdist's text on a line of its own.

Only ipykernel's ``OutStream`` is wrapped (an instance attribute, nothing global); a terminal's
or a script's stream is written as it is.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

__all__ = ["WAIT", "watch", "write_after"]

WAIT = 0.05  # seconds nbdist's text waits for the end of a line another thread is writing


class _Guard:
    """Whether the text on one stream ends mid-line, and which thread wrote that part."""

    __slots__ = ("lock", "open_by")

    def __init__(self) -> None:
        self.open_by = 0  # thread ident, 0 when the stream's text ends with a newline
        self.lock = threading.RLock()  # a write and what it says about the line, in one step


def watch(target: Any) -> None:
    """Follow the notebook's writes to ``target`` from now on (each cell does this, before
    the notebook's code prints: IPython puts its own ``write`` on the stream for the length
    of a cell, and ours goes around it)."""
    _guard(target)


def _guard(target: Any) -> _Guard | None:
    """The stream's guard, its ``write`` wrapped if it is not; None for a stream that is not
    the kernel's."""
    iostream = sys.modules.get("ipykernel.iostream")
    if iostream is None or not isinstance(target, iostream.OutStream):
        return None
    guard = target.__dict__.get("_nbdist_line_guard")
    if guard is None:
        guard = target._nbdist_line_guard = _Guard()
    current = target.write
    if getattr(current, "_nbdist_guard", None) is guard:
        return guard

    def tracked_write(s: str, *args: Any, **kwargs: Any) -> int | None:
        with guard.lock:
            n = current(s, *args, **kwargs)
            if s:
                guard.open_by = 0 if s.endswith("\n") else threading.get_ident()
        return n

    tracked_write._nbdist_guard = guard  # type: ignore[attr-defined]
    tracked_write._nbdist_inner = current  # type: ignore[attr-defined]
    target.write = tracked_write
    return guard


def write_after(target: Any, text: str) -> None:
    """Write nbdist's ``text`` (whole lines) to ``target`` after the line being written there."""
    guard = _guard(target)
    if guard is None:
        target.write(text)
        return
    me = threading.get_ident()
    deadline = time.monotonic() + WAIT
    while True:
        with guard.lock:  # no write of the notebook's between the look and nbdist's write
            opener = guard.open_by
            if not opener or opener == me or time.monotonic() >= deadline:
                if opener:
                    text = "\n" + text
                write = target.write
                getattr(write, "_nbdist_inner", write)(text)  # nbdist's text is not tracked
                if text.endswith("\n"):
                    guard.open_by = 0
                return
        time.sleep(0.001)
