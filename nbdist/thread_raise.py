"""An exception raised in another thread of this process: the one call into CPython's
``PyThreadState_SetAsyncExc`` (it fires at that thread's next Python instruction; a thread
blocked in C sees it once the call returns)."""

from __future__ import annotations

import ctypes

__all__ = ["clear_pending", "raise_in"]


def raise_in(thread_id: int, exc: type[BaseException]) -> bool:
    """Make thread ``thread_id`` raise ``exc`` next; True if it was found (a thread that has
    ended, or an unknown id, is not)."""
    return _set(thread_id, ctypes.py_object(exc)) == 1


def clear_pending(thread_id: int) -> None:
    """Drop an exception ``raise_in`` left pending in ``thread_id`` that it has not raised yet."""
    _set(thread_id, None)


def _set(thread_id: int, exc: ctypes.py_object | None) -> int:
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)
