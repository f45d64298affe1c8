"""The control channel between the notebook and its workers.

A unix socket inside a private (0700) directory, an HMAC challenge so only processes that were
handed the key can talk, and pickled messages framed by ``multiprocessing.connection``. Nothing
here listens on a network interface.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from ..errors import DistTimeoutError

__all__ = ["Channel", "Listener", "connect"]

_NONCE = 32


class Channel:
    """One end of a control connection: thread-safe ``send``, ``recv`` for one reader."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()

    def send(self, msg: Any) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def recv(self) -> Any:
        return self.conn.recv()

    def poll(self, timeout: float = 0.0) -> bool:
        return self.conn.poll(timeout)

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass


def _mac(key: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, nonce, hashlib.sha256).digest()


class Listener:
    """Accepts authenticated control connections on a unix socket path."""

    def __init__(self, path: str, authkey: bytes) -> None:
        self.path, self.authkey = path, authkey
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(256)

    def accept(self, timeout: float) -> Channel:
        """Wait up to ``timeout`` seconds for one peer that proves it holds the key."""
        self.sock.settimeout(max(timeout, 0.001))
        try:
            peer, _ = self.sock.accept()
        except TimeoutError:
            raise DistTimeoutError("no worker connected to the control socket in time") from None
        peer.settimeout(5.0)
        nonce = os.urandom(_NONCE)
        peer.sendall(nonce)
        answer = _recv_exact(peer, hashlib.sha256().digest_size)
        if not hmac.compare_digest(answer, _mac(self.authkey, nonce)):
            peer.close()
            raise PermissionError("a process without the cluster key tried to connect")
        peer.settimeout(None)
        return Channel(Connection(peer.detach()))

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed during handshake")
        buf += chunk
    return buf


def connect(path: str, authkey: bytes, timeout: float = 10.0) -> Channel:
    """Connect to a ``Listener`` and answer its challenge."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            sock.connect(path)
            nonce = _recv_exact(sock, _NONCE)
            sock.sendall(_mac(authkey, nonce))
            sock.settimeout(None)
            return Channel(Connection(sock.detach()))
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
