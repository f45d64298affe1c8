"""The rendezvous store of a world that spans hosts, carried over authenticated connections.

torch's ``TCPStore`` listens on every interface and accepts anyone. A host world uses this
instead: the notebook keeps the keys (``MemoryStore``, a ``torch.distributed.Store`` written
in Python) and serves them on one address (``StoreServer``); each rank reaches it over a
connection that proves the world's key first (``RemoteStore``, one connection per thread so
one thread's blocking ``get`` never holds up another's ``set``). ``init_rpc`` and
``init_process_group`` find it through the ``nbdist://`` rendezvous scheme (``use``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from ..control.channel import Address, Channel, HandshakeError, Listener, connect
from ..control.protocol import ProtocolError, StoreOp, StoreReply
from ..errors import DistTimeoutError

__all__ = ["ClosableStore", "MemoryStore", "RemoteStore", "StoreServer", "rendezvous_url", "use"]

SCHEME = "nbdist"


class _Rendezvous:
    """The store ``nbdist://`` URLs give in this process: the current world's, kept until
    the next world's replaces it (a process group's later rendezvous may still ask)."""

    store: dist.Store | None = None


_RENDEZVOUS_PER_PROCESS = _Rendezvous()


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class ClosableStore(dist.Store):
    """``inner``'s keys (rank 0's ``FileStore`` in a local world), with waits that end when
    this is closed or after ``timeout`` seconds.

    torch's file rendezvous gives its store 5 minutes, and the RPC agent's start waits on it
    for each peer's address in turn: rank 0's join of a start that failed (a rank killed
    meanwhile) stayed there past the next start's deadline. Closed when rank 0 leaves the
    world, the store ends those waits at once."""

    SLICE = 0.25  # seconds of one wait on ``inner`` between looks at ``closed``

    def __init__(self, inner: dist.Store, timeout: float) -> None:
        super().__init__()
        self._inner = inner
        # every operation of ``inner`` (its file opened, a key looked for) gives up after a
        # slice: the world directory goes at teardown, and FileStore keeps reopening a
        # missing file for its whole timeout; the waits below are this store's own
        inner.set_timeout(timedelta(seconds=self.SLICE))
        self._wait_s = timeout
        self.closed = False

    def _wait_for(self, keys: list[str], timeout: float | None) -> None:
        end = time.monotonic() + (self._wait_s if timeout is None else timeout)
        while True:
            if self.closed:
                raise RuntimeError("the world's rendezvous store was closed (rank 0 left the "
                                   "world: its start failed or it stopped)")
            left = end - time.monotonic()
            if left <= 0:
                raise DistTimeoutError(f"timed out waiting for rendezvous keys "
                                       f"{', '.join(keys)} (a rank did not join)")
            try:
                self._inner.wait(keys, timedelta(seconds=min(self.SLICE, left)))
                return
            except RuntimeError:  # this slice ended: look again
                continue

    def set(self, key: str, value: Any) -> None:
        self._inner.set(key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self._wait_for([key], timeout)
        return self._inner.get(key)

    def add(self, key: str, amount: int) -> int:
        return self._inner.add(key, amount)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._inner.compare_set(key, expected, desired)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        self._wait_for(list(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def set_timeout(self, timeout: timedelta) -> None:
        self._wait_s = timeout.total_seconds()

    def close(self) -> None:
        self.closed = True


class MemoryStore(dist.Store):
    """Keys in this process's memory; waits are bounded by ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._data: dict[str, bytes] = {}
        self._cv = threading.Condition()
        self._wait_s = timeout
        self.closed = False

    def _wait_for(self, keys: list[str], timeout: float | None) -> None:
        limit = self._wait_s if timeout is None else timeout
        ok = self._cv.wait_for(lambda: self.closed or all(k in self._data for k in keys), limit)
        if self.closed:
            raise RuntimeError("the world's rendezvous store was closed (the world stopped)")
        if not ok:
            raise DistTimeoutError(f"timed out after {limit:g}s waiting for rendezvous keys "
                                   f"{', '.join(keys)} (a rank did not join)")

    def set(self, key: str, value: Any) -> None:
        with self._cv:
            self._data[key] = _bytes(value)
            self._cv.notify_all()

    def get(self, key: str, timeout: float | None = None) -> bytes:
        with self._cv:
            self._wait_for([key], timeout)
            return self._data[key]

    def add(self, key: str, amount: int) -> int:
        with self._cv:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            self._cv.notify_all()
            return value

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        expected, desired = _bytes(expected), _bytes(desired)
        with self._cv:
            current = self._data.get(key)
            if (current is None and not expected) or current == expected:
                self._data[key] = desired
                self._cv.notify_all()
                return desired
            return expected if current is None else current

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        with self._cv:
            self._wait_for(list(keys), timeout)

    def check(self, keys: list[str]) -> bool:
        with self._cv:
            return all(k in self._data for k in keys)

    def num_keys(self) -> int:
        with self._cv:
            return len(self._data)

    def delete_key(self, key: str) -> bool:
        with self._cv:
            return self._data.pop(key, None) is not None

    def set_timeout(self, timeout: timedelta) -> None:
        self._wait_s = timeout.total_seconds()

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def apply(self, op: StoreOp) -> Any:
        """One operation as it came over a connection."""
        if op.op == "set":
            return self.set(op.key, op.value)
        if op.op == "get":
            return self.get(op.key, op.timeout or None)
        if op.op == "add":
            return self.add(op.key, op.number)
        if op.op == "compare_set":
            return self.compare_set(op.key, op.value, op.keys[0] if op.keys else b"")
        if op.op == "wait":
            return self.wait(list(op.keys), op.timeout or None)
        if op.op == "check":
            return self.check(list(op.keys))
        if op.op == "num_keys":
            return self.num_keys()
        if op.op == "delete_key":
            return self.delete_key(op.key)
        raise ValueError(f"unknown store operation {op.op!r}")


class StoreServer:
    """Serves a ``MemoryStore`` to ranks that prove the world's key; owns its threads."""

    def __init__(self, store: MemoryStore, address: tuple[str, int], authkey: bytes) -> None:
        self.store = store
        self.listener = Listener(address, authkey)
        self.address = self.listener.path
        self._chans: list[Channel] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._spawn(self._accept_loop, "nbdist-store-accept")

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                chan = self.listener.accept(0.2, name="a rank's store client")
            except (DistTimeoutError, HandshakeError):
                continue
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    chan.close(timeout=0)
                    return
                self._chans.append(chan)
            self._spawn(self._serve, "nbdist-store-conn", chan)

    def _serve(self, chan: Channel) -> None:
        while True:
            try:
                op = chan.recv()
            except ProtocolError:
                continue
            except (EOFError, OSError):
                return
            if not isinstance(op, StoreOp):
                continue
            try:
                reply = StoreReply(self.store.apply(op))
            except Exception as exc:  # noqa: BLE001 - the rank raises it
                reply = StoreReply(None, str(exc) or type(exc).__name__)
            try:
                chan.send(reply)
            except OSError:
                return

    def close(self, timeout: float = 2.0) -> None:
        """Stop listening, end every connection and thread."""
        self._closed = True
        self.store.close()
        self.listener.close()
        with self._lock:
            chans, threads = list(self._chans), list(self._threads)
        for chan in chans:
            chan.close(timeout=0)
        deadline = time.monotonic() + timeout
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(deadline - time.monotonic(), 0.01))


class RemoteStore(dist.Store):
    """A rank's view of the notebook's store: each operation is one request and its reply.

    Its connections (one per thread that used it) are closed by ``close``, which ``use`` calls
    when a newer store replaces it (a keep-restart)."""

    def __init__(self, address: Address, authkey: bytes, timeout: float) -> None:
        super().__init__()
        self._address, self._key, self._wait_s = address, authkey, timeout
        self._local = threading.local()
        self._chans: list[Channel] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close every thread's connection (a later operation connects again)."""
        with self._lock:
            chans, self._chans = self._chans, []
        for chan in chans:
            chan.close(timeout=0)

    def _call(self, op: StoreOp) -> Any:
        chan = getattr(self._local, "chan", None)
        if chan is None or chan.closed:
            chan = self._local.chan = connect(self._address, self._key, timeout=self._wait_s,
                                              name="the rendezvous store", threaded=False)
            with self._lock:
                self._chans.append(chan)
        chan.send(op)
        reply = chan.recv(timeout=(op.timeout or self._wait_s) + 10.0)
        if not isinstance(reply, StoreReply):
            raise RuntimeError(f"unexpected reply from the rendezvous store: {reply!r}")
        if reply.error:
            raise RuntimeError(reply.error)
        return reply.value

    def set(self, key: str, value: Any) -> None:
        self._call(StoreOp("set", key, _bytes(value)))

    def get(self, key: str) -> bytes:
        return self._call(StoreOp("get", key, timeout=self._wait_s))

    def add(self, key: str, amount: int) -> int:
        return self._call(StoreOp("add", key, number=int(amount)))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call(StoreOp("compare_set", key, _bytes(expected), (_bytes(desired),)))

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        self._call(StoreOp("wait", keys=tuple(keys), timeout=timeout or self._wait_s))

    def check(self, keys: list[str]) -> bool:
        return self._call(StoreOp("check", keys=tuple(keys)))

    def num_keys(self) -> int:
        return self._call(StoreOp("num_keys"))

    def delete_key(self, key: str) -> bool:
        return self._call(StoreOp("delete_key", key))

    def set_timeout(self, timeout: timedelta) -> None:
        self._wait_s = timeout.total_seconds()


def _handler(url: str, **kwargs: Any) -> Iterator[tuple[dist.Store, int, int]]:
    query = parse_qs(urlparse(url).query)
    store = _RENDEZVOUS_PER_PROCESS.store
    if store is None:
        raise RuntimeError("no nbdist rendezvous store in this process")
    yield store, int(query["rank"][0]), int(query["world_size"][0])


def use(store: dist.Store) -> None:
    """Make ``store`` what ``nbdist://`` rendezvous URLs give in this process."""
    previous = _RENDEZVOUS_PER_PROCESS.store
    _RENDEZVOUS_PER_PROCESS.store = store
    if isinstance(previous, RemoteStore) and previous is not store:
        previous.close()  # its world is gone: its sockets are not left to the collector
    try:
        dist.register_rendezvous_handler(SCHEME, _handler)
    except RuntimeError:
        pass  # registered already (a second world in this process)


def rendezvous_url(purpose: str) -> str:
    """The init_method for ``purpose`` (``rpc`` or ``pg``) in a host world."""
    return f"{SCHEME}://{purpose}"
