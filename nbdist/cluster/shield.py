"""Ctrl-C held back while a step must finish: forking ranks (until their pids are known) and
tearing a world down. A KeyboardInterrupt raised midway would leave a forked worker no one
knows of, or a world half stopped (issue 45's stress test: a Ctrl-C during a start left a
worker running after the start said it was gone). The interrupt is raised when the step ends;
both steps are bounded by their own deadlines.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["held_interrupts"]


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """SIGINT during the block is remembered, then raised as KeyboardInterrupt after it (in
    the main thread only; elsewhere, and where SIGINT is not Python's to handle, a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGINT)
    if not callable(old):  # ignored or default: no KeyboardInterrupt to hold back
        yield
        return
    caught: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if caught:
        raise KeyboardInterrupt
