"""Waiting for file descriptors to be readable, whatever their numbers.

``select.select`` refuses a descriptor numbered 1024 or more (``filedescriptor out of range in
select()``), and a big world's rank 0 holds thousands (2,424 at 256 ranks over TCP): a
control channel accepted after them (a healed rank, or a notebook that opened many files)
could not be waited on, and the receiver's loop stopped hearing every rank. ``readable``
waits with ``poll``, which has no such limit, and fails on a closed or bad descriptor as
``select`` did (``OSError``, or ``ValueError`` for a negative one), so callers keep their
handling.
"""

from __future__ import annotations

import errno
import math
import select
from collections.abc import Iterable

__all__ = ["readable"]

_READ = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_LONGEST_MS = 2**31 - 1  # poll()'s timeout is a C int of milliseconds (24.8 days)


def readable(fds: Iterable[int], timeout: float | None) -> list[int]:
    """Those of ``fds`` with something to read (or at their end) within ``timeout`` seconds
    (None: until one has); ``OSError`` (EBADF) if one is not an open descriptor."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, _READ)
    ms = None if timeout is None else min(max(math.ceil(timeout * 1000), 0), _LONGEST_MS)
    ready = []
    for fd, events in poller.poll(ms):
        if events & select.POLLNVAL:
            raise OSError(errno.EBADF, f"file descriptor {fd} is not open")
        ready.append(fd)
    return ready
