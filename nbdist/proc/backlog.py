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

__all__ = ["BACKLOG", "Widener"]

BACKLOG = 4096


class Widener:
    """Widens each TCP listener of this process once; ``scan`` is cheap to call often.

    Only descriptors that were not open at the last scan are looked at (reading the links of
    all of them took 17 ms at rank 0's 2,400 descriptors of a 256-rank world, beyond the 10 ms
    between scans), so a listener whose number was closed and reused between two scans is
    not seen: TensorPipe's are opened once, as its agent starts."""

    def __init__(self, backlog: int = BACKLOG) -> None:
        self.backlog = backlog
        self.widened: list[int] = []  # the ports given a long queue, in order
        self._open: set[str] = set()  # the descriptors open at the last scan

    def scan(self) -> int:
        """Widen the listeners opened since the last scan; how many were."""
        before = len(self.widened)
        try:
            now = set(os.listdir("/proc/self/fd"))
        except OSError:
            return 0
        for name in now - self._open:
            self._widen(int(name))
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
