"""The control channel: framed protocol messages over a private, mutually authenticated socket.

Security model: a unix socket inside a private (0700) runtime directory; before either side
reads a message, each proves it holds the world's key (HMAC-SHA256 over the other side's
fresh nonce, compared in constant time), so a stray or hostile local process can neither
talk to a worker nor pose as the notebook. Nothing here listens on a network interface.

Frames are written whole: ``send`` only encodes and queues (it is safe to interrupt), and
one writer thread per channel, which no signal or async exception reaches, does the writes.
A frame that does not decode is a ``ProtocolError`` for that frame alone (see protocol.py).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import itertools
import os
import socket
import threading
import time

from ..errors import DistTimeoutError
from ..fd_wait import readable
from ..wake_flag import WakeFlag
from .protocol import HEADER, Message, decode, encode, frame_length

__all__ = [
    "Channel",
    "ChannelBlocked",
    "ChannelClosed",
    "HandshakeError",
    "Listener",
    "connect",
]

_NONCE = 32
_MAC = hashlib.sha256().digest_size
QUEUE_LIMIT = 4096  # frames waiting to be written before ``send`` applies back-pressure
QUEUE_BYTES = 16 << 20  # ... or this many bytes
FRAME_DEADLINE = 10.0  # seconds a started frame may take to arrive in full


_LockType = type(threading.Lock())


class ChannelClosed(OSError):
    """The channel is closed, or its peer went away."""


class ChannelBlocked(ChannelClosed):
    """The peer has not read for a while: ``send`` gave up waiting for room (retry later)."""


class HandshakeError(PermissionError):
    """The peer did not prove it holds the key (or did not answer in time)."""


class Channel:
    """One end of a control connection: ``send`` from any thread, ``recv`` for one reader.

    ``threaded=False`` writes in the caller's thread instead of a writer thread, for a
    process that must stay single-threaded (the template, which forks) and is never
    interrupted mid-write (it ignores SIGINT).
    """

    def __init__(self, sock: socket.socket, threaded: bool = True, name: str = "peer") -> None:
        sock.setblocking(True)
        self.sock = sock
        self.name = name
        self._fd = sock.fileno()
        self._closed = False
        self._broken: BaseException | None = None
        self._queue: collections.deque = collections.deque()
        self._queued_bytes = 0
        self._bytes_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._drop_upto = 0  # droppable frames with a number up to this are not written
        self.dropped_bytes = 0
        self._wake = WakeFlag()  # the writer's: interrupt-proof, as send() must be
        self._writer: threading.Thread | None = None
        if threaded:
            self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                            name=f"nbdist-send-{name}")
            self._writer.start()

    # -- sending ------------------------------------------------------------------------------
    def send(self, msg: Message, block: float = 10.0, droppable: bool = False) -> int:
        """Queue ``msg`` (encoded here, so errors surface in the caller); never cuts a frame;
        returns the payload's length in bytes.

        When ``QUEUE_LIMIT`` frames or ``QUEUE_BYTES`` bytes already wait, waits up to
        ``block`` seconds for room, then raises ``ChannelBlocked``. ``droppable`` frames
        (printed output) may be discarded by ``drop_pending`` before they are written.
        """
        payload = encode(msg)
        if self._writer is None:
            self._write_frame(payload)
            return len(payload)
        if self._full():
            give_up = time.monotonic() + block
            while self._full():
                if self._closed or self._broken is not None:
                    break
                if time.monotonic() > give_up:
                    raise ChannelBlocked(f"the control channel to {self.name} is blocked")
                time.sleep(0.001)
        if self._closed or self._broken is not None:
            raise ChannelClosed(f"the control channel to {self.name} is closed")
        with self._bytes_lock:
            self._queued_bytes += len(payload)
        # one atomic step: an interrupt lands before or after, never inside
        self._queue.append((payload, droppable, next(self._seq)))
        self._wake.set()
        return len(payload)

    def send_frame(self, payload: bytes) -> None:
        """Queue an already-encoded frame payload as it is (a relayed frame; tests of a
        peer's decoder); an unthreaded channel writes it at once."""
        if self._writer is None:
            self._write_frame(bytes(payload))
            return
        with self._bytes_lock:
            self._queued_bytes += len(payload)
        self._queue.append((bytes(payload), False, next(self._seq)))
        self._wake.set()

    def _full(self) -> bool:
        return len(self._queue) >= QUEUE_LIMIT or self._queued_bytes >= QUEUE_BYTES

    def drop_pending(self) -> None:
        """Do not write the droppable frames queued so far (output after a Ctrl-C)."""
        self._drop_upto = next(self._seq)

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every frame queued so far has been written; False on timeout/closed."""
        if self._writer is None or self._closed or self._broken is not None:
            return self._writer is None
        if not self._queue and not self._queued_bytes:  # nothing queued, nothing mid-write
            return True
        done = threading.Lock()
        done.acquire()
        self._queue.append(done)
        self._wake.set()
        return done.acquire(timeout=timeout)

    def _write_loop(self) -> None:
        queue = self._queue
        while True:
            while queue:
                item = queue.popleft()
                if type(item) is tuple:
                    payload, droppable, seq = item
                    if droppable and seq <= self._drop_upto:
                        self.dropped_bytes += len(payload)
                    elif self._broken is None:
                        try:
                            self._write_frame(payload)
                        except OSError as exc:
                            self._broken = exc
                    with self._bytes_lock:  # only now: drain() counts it pending until here
                        self._queued_bytes -= len(payload)
                elif isinstance(item, _LockType):
                    item.release()  # a drain marker
            if self._closed:
                return
            self._wake.wait(1.0)

    def _write_frame(self, payload: bytes) -> None:
        self.sock.sendall(HEADER.pack(len(payload)))
        self.sock.sendall(payload)

    # -- receiving ----------------------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> Message:
        """The next message. ``ProtocolError``: that frame was dropped, the next may be fine;
        ``FramingError``/``EOFError``/``OSError``: the channel is unusable;
        ``DistTimeoutError``: nothing arrived within ``timeout``."""
        if timeout is not None and not self.poll(timeout):
            raise DistTimeoutError(f"no control message from {self.name} within {timeout:g}s")
        return decode(self.recv_payload())

    def recv_payload(self) -> bytes:
        """The next frame's payload, not decoded (a relay passes it on as it came)."""
        n = frame_length(self._read_exact(HEADER.size, first=True))
        return self._read_exact(n)

    def _read_exact(self, n: int, first: bool = False) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        deadline = None
        while got < n:
            if not (first and got == 0):
                if deadline is None:
                    deadline = time.monotonic() + FRAME_DEADLINE
                left = deadline - time.monotonic()
                if left <= 0 or not readable((self._fd,), left):
                    raise ChannelClosed(f"{self.name} stopped in the middle of a frame")
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise EOFError(f"the control channel to {self.name} closed")
            got += k
        return bytes(buf)

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message (or EOF) is ready to read within ``timeout`` seconds."""
        return bool(readable((self._fd,), max(timeout, 0.0)))

    def fileno(self) -> int:
        return self._fd

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float = 1.0) -> None:
        """Write what is queued (up to ``timeout``), stop the writer, close the socket."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join(timeout)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# -- authentication ---------------------------------------------------------------------------
def _mac(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise HandshakeError("the peer closed the connection during the handshake")
        buf += chunk
    return buf


Address = str | tuple[str, int]  # a unix socket path, or (IPv4 address, port)


def _socket_for(address: Address) -> socket.socket:
    if isinstance(address, str):
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


#: Connections waiting to be accepted: every rank of a big world connects at once, and a unix
#: socket refuses past its backlog (the kernel caps it at ``net.core.somaxconn``).
_BACKLOG = 4096


class Listener:
    """Accepts mutually authenticated control connections on a unix socket path, or on one
    address's TCP port (``(address, 0)`` picks a free one; never bind ``0.0.0.0``)."""

    def __init__(self, address: Address, authkey: bytes) -> None:
        self.authkey = authkey
        self.sock = _socket_for(address)
        if isinstance(address, str):
            self.sock.bind(address)
            os.chmod(address, 0o600)
            self.path: Address = address
        else:
            if address[0] in ("", "0.0.0.0"):
                raise ValueError("a control listener binds one address, not every interface")
            self.sock.bind(address)
            self.path = self.sock.getsockname()[:2]
        self.sock.listen(_BACKLOG)
        self.rejected: list[str] = []  # why each refused peer was refused

    def accept(self, timeout: float, handshake_timeout: float = 2.0,
               name: str = "worker") -> Channel:
        """One authenticated peer within ``timeout`` seconds.

        A peer that fails the handshake, or is silent for ``handshake_timeout``, is dropped
        (its reason kept in ``rejected``) and ``HandshakeError`` raised; call again.
        """
        self.sock.settimeout(max(timeout, 0.001))
        try:
            peer, _ = self.sock.accept()
        except TimeoutError:
            raise DistTimeoutError("no worker connected to the control socket in time") from None
        try:
            peer.settimeout(handshake_timeout)
            nonce = os.urandom(_NONCE)
            peer.sendall(nonce)
            answer = _recv_exact(peer, _MAC + _NONCE)
            if not hmac.compare_digest(answer[:_MAC], _mac(self.authkey, b"worker", nonce)):
                raise HandshakeError("a process without the world's key tried to connect")
            peer.sendall(_mac(self.authkey, b"notebook", answer[_MAC:]))
            peer.settimeout(None)
        except (OSError, HandshakeError) as exc:
            peer.close()
            why = str(exc) if isinstance(exc, HandshakeError) else \
                f"a connection that did not complete the handshake ({exc or 'timed out'})"
            self.rejected.append(why)
            raise HandshakeError(why) from None
        if peer.family == socket.AF_INET:
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Channel(peer, name=name)

    def close(self) -> None:
        self.sock.close()
        if isinstance(self.path, str):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def connect(path: Address, authkey: bytes, timeout: float = 10.0, name: str = "notebook",
            threaded: bool = True) -> Channel:
    """Connect to a ``Listener``; both sides prove they hold ``authkey``."""
    deadline = time.monotonic() + timeout
    if isinstance(path, list):  # a (address, port) that travelled through a config
        path = (path[0], int(path[1]))
    while True:
        sock = _socket_for(path)
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            sock.connect(path)
            nonce = _recv_exact(sock, _NONCE)
            mine = os.urandom(_NONCE)
            sock.sendall(_mac(authkey, b"worker", nonce) + mine)
            proof = _recv_exact(sock, _MAC)
            if not hmac.compare_digest(proof, _mac(authkey, b"notebook", mine)):
                raise HandshakeError(f"the process listening on {path} does not hold the "
                                     "world's key")
            sock.settimeout(None)
            return Channel(sock, threaded=threaded, name=name)
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError):
            sock.close()  # not listening yet, or its backlog full: try again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
        except BaseException:
            sock.close()
            raise
