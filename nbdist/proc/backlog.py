"""Long accept queues for the TCP listeners a process opens while it joins a big world.

TensorPipe listens with a backlog of 128, and as a world starts every rank connects to rank 0
at once (torch's ``init_rpc`` ends with a gather at one rank). Past 128 ranks the kernel's
queue overflows: the connections it drops come back through SYN cookies, and now and then one
is reset (1 start of 10 at 256 ranks failed with ``ECONNRESET ...
tensorpipe/transport/uv/connection_impl.cc``; the kernel counted ~800 listen overflows per
start). ``listen()`` again on a listening socket changes its backlog in place, so
``Widener.scan`` finds this process's new TCP listeners among its open files and gives each
``BACKLOG`` (the kernel caps it at ``net.core.somaxconn``). Nothing of torch is touched: the
sockets are this process's own.
"""

from __future__ import annotations

import os
import socket

__all__ = ["BACKLOG", "RECHECK_EVERY", "Widener"]

BACKLOG = 4096
RECHECK_EVERY = 5  # scans: every fifth also looks for descriptor numbers reused since


def _inode(fd: int) -> int:
    """The inode of the file ``fd`` is now (-1: closed since the listing)."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return -1


class Widener:
    """Widens each TCP listener of this process once; ``scan`` is cheap to call often.

    A scan looks at the descriptors that were not open at the last one (reading the links of
    all of them took 17 ms at rank 0's 2,400 descriptors of a 256-rank world, beyond the 10 ms
    between scans). Every ``RECHECK_EVERY``-th scan also asks each known descriptor which
    file it is now (``fstat``'s inode, about a microsecond each), so one closed and its number
    reused between two scans, as a listener, is widened too: Gloo's pairs in ``init_rpc``
    open and close sockets while TensorPipe opens its listeners (a 17-rank world's check
    found one of rank 0's 17 left at 128)."""

    def __init__(self, backlog: int = BACKLOG) -> None:
        self.backlog = backlog
        self.widened: list[int] = []  # the ports given a long queue, in order
        self._open: dict[str, int] = {}  # the descriptors open at the last scan -> inode
        self._scans = 0

    def scan(self) -> int:
        """Widen the listeners opened since the last scan; how many were."""
        before = len(self.widened)
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return 0
        self._scans += 1
        recheck = self._scans % RECHECK_EVERY == 0
        now: dict[str, int] = {}
        for name in names:
            known = self._open.get(name)
            if known is not None and not recheck:
                now[name] = known
                continue
            inode = _inode(int(name))
            if inode != known:
                self._widen(int(name))
            now[name] = inode
        self._open = now
        return len(self.widened) - before

    def _widen(self, fd: int) -> None:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # closed since the listing, or not a socket
            return
        try:
            if (sock.family in (socket.AF_INET, socket.AF_INET6)
                    and sock.type == socket.SOCK_STREAM
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                sock.listen(self.backlog)
                self.widened.append(sock.getsockname()[1])
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays its owner's
