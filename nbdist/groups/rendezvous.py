"""Where the members of one user process group meet in a world's private store.

As under torch, members naming the same rendezvous (``name``: the ``init_method``'s address, or
``MASTER_ADDR:MASTER_PORT`` for ``env://``) and size form a group whatever their world ranks, and
a member other than rank 0 first waits for rank 0 (``DistNetworkError`` when it never comes).
Each group gets fresh keys (a generation): members join the open one and the one that fills it
opens the next; a failed or interrupted attempt (``Meeting.leave``) ends its generation, so the
next attempt meets in a fresh one. Waits run in short slices, so Ctrl-C or ``abandon`` (from
another thread) ends them at once; one that runs out raises torch's error naming its keys.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Meeting", "abandon", "abandoned", "name", "resume"]

SLICE = 0.01  # seconds between two looks at the store while waiting


@dataclass
class _Abandon:
    """Why every rendezvous wait in this process gives up now (None: they go on)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    reason: str | None = None


_ABANDON_PER_PROCESS = _Abandon()


def abandon(reason: str) -> None:
    """Make every rendezvous wait in this process give up now, saying ``reason``."""
    with _ABANDON_PER_PROCESS.lock:
        _ABANDON_PER_PROCESS.reason = reason


def resume() -> None:
    """Rendezvous waits wait again (a new cell began)."""
    with _ABANDON_PER_PROCESS.lock:
        _ABANDON_PER_PROCESS.reason = None


def abandoned() -> str | None:
    """Why waits give up now, or None."""
    return _ABANDON_PER_PROCESS.reason


def name(init_method: str | None) -> str:
    """The rendezvous an ``init_method`` names: its address, without query."""
    if init_method and not init_method.startswith("env://"):
        parts = urlsplit(init_method)
        return f"{parts.scheme}://{parts.netloc}{parts.path}"
    return f"env://{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"


class Meeting:
    """One member's attempt to meet the others of a group at a rendezvous; ``store`` is what
    ``init_process_group`` takes."""

    def __init__(self, base: Any, prefix: str, rendezvous: str, size: int,
                 timeout: float) -> None:
        import torch.distributed as dist

        self.base, self.size, self.rendezvous = base, size, rendezvous
        self.root = f"{prefix}/{rendezvous}/{size}"
        self.generation = _join(base, self.root, size)
        keys = dist.PrefixStore(f"{self.root}/{self.generation}/", base)
        self.store = _recorded(keys, timeout)

    def meet_rank0(self, rank: int, timeout: float) -> None:
        """Rank 0 says it came; any other rank waits for it, as torch's store client waits
        to connect to rank 0's store (``DistNetworkError`` when it never comes)."""
        import torch.distributed as dist

        if rank == 0:
            self.store.set(_RANK0, b"1")
            return
        try:
            self.store.wait([_RANK0], timedelta(seconds=timeout))
        except dist.DistStoreError:
            raise dist.DistNetworkError(
                f"rank {rank} waited {timeout:g}s for rank 0 of a group of {self.size} at "
                f"{self.rendezvous} to call init_process_group (torch's store client would "
                f"time out connecting to rank 0's store)") from None

    def leave(self) -> None:
        """This attempt failed: take its keys back and end its generation, so the next
        attempt meets in a fresh one whatever this one left behind."""
        self.store.forget()
        try:
            self.base.add(f"{self.root}/{self.generation}/count", _ENDED)
            _close(self.base, self.root, self.generation)
        except Exception:  # noqa: BLE001 - the store went with the world
            pass


_RANK0 = "nbdist-rank0-came"
_ENDED = 1 << 40  # added to an ended generation's count: nobody joins it any more


def _join(base: Any, root: str, size: int) -> int:
    """The generation this member joins: the open one unless it is full or ended (then it
    is closed and the next one tried). Only ``add`` is used: atomic in every store."""
    while True:
        generation = base.add(f"{root}/open", 0)
        arrived = base.add(f"{root}/{generation}/count", 1)
        if arrived <= size:
            if arrived == size:
                _close(base, root, generation)
            return generation
        _close(base, root, generation)


def _close(base: Any, root: str, generation: int) -> None:
    """Open the generation after ``generation`` (once, whoever asks first)."""
    if base.add(f"{root}/{generation}/closed", 1) == 1:
        base.add(f"{root}/open", 1)


_STORE_CLASS_PER_PROCESS: list[type] = []


def _recorded(inner: Any, timeout: float) -> Any:
    if not _STORE_CLASS_PER_PROCESS:
        _STORE_CLASS_PER_PROCESS.append(_recorded_store_class())
    return _STORE_CLASS_PER_PROCESS[0](inner, timeout)


def _recorded_store_class() -> type:
    import torch.distributed as dist

    class Recorded(dist.Store):
        """A group's store that waits in slices and remembers the keys this rank wrote, so a
        failed attempt can take them back: a rank that comes later must not read a dead
        listener's address."""

        def __init__(self, inner: Any, timeout: float) -> None:
            super().__init__()
            self.inner, self.written, self.seconds = inner, set(), timeout

        def set(self, key: str, value: Any) -> None:
            self.written.add(key)
            self.inner.set(key, value)

        def add(self, key: str, amount: int) -> int:
            self.written.add(key)
            return self.inner.add(key, amount)

        def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
            self.written.add(key)
            return self.inner.compare_set(key, expected, desired)

        def get(self, key: str) -> Any:
            self._wait([key], None)
            return self.inner.get(key)

        def wait(self, keys: list[str], *timeout: Any) -> None:
            self._wait(keys, timeout[0] if timeout else None)

        def _wait(self, keys: list[str], timeout: Any) -> None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else self.seconds
            deadline = time.monotonic() + seconds
            while not self.inner.check(keys):
                reason = _ABANDON_PER_PROCESS.reason
                if reason is not None:
                    raise RuntimeError(f"init_process_group gave up waiting for the other "
                                       f"members of the group: {reason}")
                if time.monotonic() > deadline:
                    raise dist.DistStoreError(f"Timed out after {seconds:g}s waiting for the "
                                              f"keys {', '.join(keys)} of a process group")
                time.sleep(SLICE)

        def check(self, keys: list[str]) -> bool:
            return self.inner.check(keys)

        def num_keys(self) -> int:
            return self.inner.num_keys()

        def delete_key(self, key: str) -> bool:
            self.written.discard(key)
            return self.inner.delete_key(key)

        def set_timeout(self, timeout: timedelta) -> None:
            self.seconds = timeout.total_seconds()
            self.inner.set_timeout(timeout)

        def forget(self) -> None:
            for key in list(self.written):
                try:
                    self.inner.delete_key(key)
                except Exception:  # noqa: BLE001 - the store went with the world
                    pass
            self.written.clear()

    return Recorded
