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
    """Widens each TCP listener of this process once; ``scan`` is cheap to call often."""

    def __init__(self, backlog: int = BACKLOG) -> None:
        self.backlog = backlog
        self.widened: list[int] = []  # the ports given a long queue, in order
        self._seen: set[tuple[int, str]] = set()  # (fd, "socket:[inode]") looked at

    def scan(self) -> int:
        """Widen the listeners opened since the last scan; how many were."""
        before = len(self.widened)
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError:
            return 0
        for name in fds:
            fd = int(name)
            try:
                link = os.readlink(f"/proc/self/fd/{name}")
            except OSError:  # closed since the listing
                continue
            if not link.startswith("socket:") or (fd, link) in self._seen:
                continue
            self._seen.add((fd, link))
            self._widen(fd)
        return len(self.widened) - before

    def _widen(self, fd: int) -> None:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # closed, or not a socket any more
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
