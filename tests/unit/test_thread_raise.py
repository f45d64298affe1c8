"""``thread_raise``: an exception raised in another thread, and one left pending dropped."""

from __future__ import annotations

import sys
import threading
import time

from nbdist.thread_raise import clear_pending, raise_in


class _Stop(Exception):
    pass


def _spinner(caught: list, go: threading.Event, until: float) -> threading.Thread:
    def spin() -> None:
        try:
            go.wait(5.0)
            while time.monotonic() < until:
                time.sleep(0.001)  # Python instructions between sleeps: the exception fires
        except _Stop:
            caught.append("stopped")
        else:
            caught.append("ran out")

    t = threading.Thread(target=spin, daemon=True)
    t.start()
    return t


def test_an_exception_is_raised_in_the_other_thread():
    caught, go = [], threading.Event()
    t = _spinner(caught, go, time.monotonic() + 10.0)
    assert raise_in(t.ident, _Stop)
    go.set()
    t.join(10.0)
    assert caught == ["stopped"]


def test_a_pending_exception_is_dropped():
    caught, go = [], threading.Event()
    t = _spinner(caught, go, time.monotonic() + 0.3)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)  # this thread keeps the GIL from one call to the next
    try:
        assert raise_in(t.ident, _Stop)
        clear_pending(t.ident)  # before the thread ran an instruction since
    finally:
        sys.setswitchinterval(interval)
    go.set()
    t.join(10.0)
    assert caught == ["ran out"]


def test_an_unknown_thread_is_not_found():
    # not an ended thread's ident: the next thread started may reuse it (idents are the
    # addresses of pthread structures), and the exception would land in that one
    unknown = 1
    assert unknown not in sys._current_frames()
    assert not raise_in(unknown, _Stop)
