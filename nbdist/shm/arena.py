"""A pooled shared-memory arena per rank, and the peers' mappings of it (no torch here).

The owner makes an anonymous ``memfd`` after the fork (nothing in ``/dev/shm``), carves
pre-faulted slots from it and reuses them; a peer maps it through ``/proc/<pid>/fd/<fd>``
(same user only), checks its token and keeps no descriptor. Each slot has one state word with
one writer at a time (``FREE`` → owner ``SENT`` → receiver pid → ``FREE``); slots of dead pids
and unclaimed slots (``UNCLAIMED_S``) come back, and a changed generation raises instead of
reading reused memory. The state machine in full: docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import threading
import time

__all__ = ["FREE", "SENT", "Arena", "PeerArena", "pid_alive"]

FREE, SENT = 0, -1
MAGIC = 0x6E62_6473_686D_0001  # "nbdshm", version 1
HEADER = 64 * 1024  # magic, token, size, used, then MAX_SLOTS x (state, generation)
MAX_SLOTS = 2048
ALIGN = 64 * 1024  # slot capacity granularity (and alignment)
UNCLAIMED_S = 600.0  # a slot sent but never claimed is taken back after this long
_W_MAGIC, _W_TOKEN, _W_SIZE, _W_USED = 0, 1, 2, 3
_SLOT0 = 8  # word index of slot 0's state

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd: int, length: int) -> int:
    addr = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"nbdist shm: mmap of {length} bytes failed: {os.strerror(err)}")
    return addr


def _populate(addr: int, length: int) -> None:
    """Fault the pages in now, with one system call (a write per page where it is refused)."""
    if _libc.madvise(addr, length, _MADV_POPULATE_WRITE) != 0:
        ctypes.memset(addr, 0, length)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead: it holds nothing any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class _Words:
    """The int64 words of an arena's header, through one mapping."""

    def __init__(self, addr: int) -> None:
        self.w = (ctypes.c_int64 * (HEADER // 8)).from_address(addr)

    def state(self, slot: int) -> int:
        return self.w[_SLOT0 + 2 * slot]

    def set_state(self, slot: int, value: int) -> None:
        self.w[_SLOT0 + 2 * slot] = value

    def gen(self, slot: int) -> int:
        return self.w[_SLOT0 + 2 * slot + 1]


class Arena:
    """This rank's arena: ``size`` bytes of slots, carved and faulted in as they are needed.

    ``alloc`` (thread-safe) returns ``(slot, offset, generation)`` or None when nothing fits
    (the caller then sends the ordinary way). Descriptors: only ``fd``, kept open so that
    peers can map it, until ``close``.
    """

    def __init__(self, size: int) -> None:
        self.size = -(-size // ALIGN) * ALIGN
        self.length = HEADER + self.size
        self.token = secrets.randbits(62) | 1
        self.pid = os.getpid()
        self.fd = os.memfd_create("nbdist-shm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.length)
            self.addr = _map(self.fd, self.length)
        except BaseException:
            os.close(self.fd)
            raise
        _populate(self.addr, HEADER)
        self.words = _Words(self.addr)
        w = self.words.w
        w[_W_TOKEN], w[_W_SIZE], w[_W_USED], w[_W_MAGIC] = self.token, self.size, 0, MAGIC
        self._slots: list[list] = []  # [offset, capacity, time sent]
        self._tail = HEADER
        self.faulted = 0  # bytes of slots faulted in (committed memory)
        self._lock = threading.Lock()
        self.closed = False
        self._writers = 0  # allocs whose bytes are being written (close waits for them)

    def alloc(self, nbytes: int) -> tuple[int, int, int] | None:
        cap = -(-max(nbytes, 1) // ALIGN) * ALIGN
        with self._lock:
            if self.closed or cap > self.size:
                return None
            found = self._fit(cap)
            if found is None:
                self._reclaim()
                found = self._fit(cap)
            if found is None:
                return None
            slot = found
            offset, _, _ = self._slots[slot]
            w = self.words.w
            gen = w[_SLOT0 + 2 * slot + 1] + 1
            w[_SLOT0 + 2 * slot + 1] = gen
            w[_SLOT0 + 2 * slot] = SENT
            self._slots[slot][2] = time.monotonic()
            self._publish_used()
            self._writers += 1
            return slot, offset, gen

    def written(self) -> None:
        """The bytes of an ``alloc`` are written (or abandoned): a ``close`` meanwhile unmaps
        only now, so a send in another thread never writes into unmapped memory."""
        with self._lock:
            self._writers -= 1
            last = self.closed and self._writers == 0
        if last:
            _libc.munmap(self.addr, self.length)

    def _fit(self, cap: int) -> int | None:
        """The smallest free slot that holds ``cap`` bytes (at most 4x larger), else a new
        one from the untouched end, else None; the layout starts over when all are free."""
        words, best = self.words, None
        all_free = True
        for i, (_, c, _) in enumerate(self._slots):
            if words.state(i) != FREE:
                all_free = False
            elif cap <= c <= 4 * cap and (best is None or c < self._slots[best][1]):
                best = i
        if best is not None:
            return best
        if all_free and self._slots and self._tail + cap > self.length:
            self._slots.clear()  # the faulted pages stay faulted: only the carving restarts
            self._tail = HEADER
        if self._tail + cap > self.length or len(self._slots) >= MAX_SLOTS:
            return None
        offset = self._tail
        if offset - HEADER + cap > self.faulted:
            start = max(offset, HEADER + self.faulted)
            _populate(self.addr + start, offset + cap - start)
            self.faulted = offset - HEADER + cap
        self._tail += cap
        self._slots.append([offset, cap, 0.0])
        return len(self._slots) - 1

    def _reclaim(self) -> None:
        """Slots whose holder died, and slots sent but never claimed for ``UNCLAIMED_S``."""
        now = time.monotonic()
        for i, (_, _, sent) in enumerate(self._slots):
            s = self.words.state(i)
            if (s > 0 and not pid_alive(s)) or (s == SENT and now - sent > UNCLAIMED_S):
                self.words.set_state(i, FREE)

    def _publish_used(self) -> None:
        self.words.w[_W_USED] = self.used()

    def used(self) -> int:
        """Bytes in slots that are not free (sent, or held by a receiver)."""
        return sum(c for i, (_, c, _) in enumerate(self._slots) if self.words.state(i) != FREE)

    def usage(self) -> dict:
        """``used``, ``faulted`` (committed) and ``size`` in bytes, and the slot count."""
        with self._lock:
            if self.closed:
                return {"used": 0, "faulted": 0, "size": self.size, "slots": 0}
            self._reclaim()
            return {"used": self.used(), "faulted": self.faulted, "size": self.size,
                    "slots": len(self._slots)}

    def unclaimed(self, slot: int, gen: int) -> bool:
        """Whether slot ``slot``, sent as generation ``gen``, is still on its way (sent, its
        receiver has not taken it yet)."""
        return self.words.state(slot) == SENT and self.words.gen(slot) == gen

    def release(self, slot: int) -> None:
        """The owner gives back a slot it allocated but did not send (before ``written``)."""
        with self._lock:
            self.words.set_state(slot, FREE)

    def close(self) -> None:
        """Close the descriptor and unmap (peers keep their own mappings)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            os.close(self.fd)
            if self._writers:
                return  # the last ``written`` unmaps
            _libc.munmap(self.addr, self.length)


class PeerArena:
    """A peer's arena mapped here: slots are read (or kept) and given back by state word.

    ``live`` counts the slots this process holds (from ``hold`` to ``give_back``); once
    ``retire`` was called (the world ended) the mapping goes with the last of them.
    """

    def __init__(self, pid: int, fd: int, token: int, length: int) -> None:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            dfd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise RuntimeError(f"nbdist shm: cannot open the arena of process {pid} "
                               f"({exc.strerror}); it may have ended") from exc
        try:
            if os.fstat(dfd).st_size != length:
                raise RuntimeError(f"nbdist shm: process {pid}'s arena is not the one sent")
            self.addr = _map(dfd, length)
        finally:
            os.close(dfd)
        self.length, self.pid, self.token = length, pid, token
        self.words = _Words(self.addr)
        if self.words.w[_W_MAGIC] != MAGIC or self.words.w[_W_TOKEN] != token:
            _libc.munmap(self.addr, length)
            raise RuntimeError(f"nbdist shm: process {pid}'s arena is not the one sent")
        self._faulted: set[tuple[int, int]] = set()
        self._lock = threading.RLock()  # give_back may run from a finalizer on any thread
        self.live = 0
        self.retired = False

    def half_full(self) -> bool:
        """Whether the owner has more than half of its arena in use (then receivers copy)."""
        w = self.words.w
        return w[_W_USED] * 2 > w[_W_SIZE]

    def check(self, slot: int, gen: int) -> None:
        w = self.words
        if w.gen(slot) != gen or w.state(slot) != SENT:
            raise RuntimeError(f"nbdist shm: slot {slot} of process {self.pid}'s arena was "
                               "taken back before this message was read (it waited more than "
                               f"{UNCLAIMED_S:.0f} s)")

    def prefault(self, offset: int, nbytes: int) -> None:
        """Map a slot's pages here once (one system call instead of a fault per page)."""
        key = (offset, nbytes)
        if key not in self._faulted:
            _populate(self.addr + offset, nbytes)
            if len(self._faulted) > 4096:
                self._faulted.clear()
            self._faulted.add(key)

    def pin(self) -> bool:
        """Keep the mapping while a message is read (False: it is gone already)."""
        with self._lock:
            if not self.addr:
                return False
            self.live += 1
            return True

    def unpin(self) -> None:
        """A pinned read that claimed nothing is over."""
        with self._lock:
            self.live -= 1
            last = self.retired and self.live == 0
        if last:
            self._unmap()

    def hold(self, slot: int) -> None:
        """Claim the slot for this process (pinned: until ``give_back``)."""
        self.words.set_state(slot, os.getpid())

    def give_back(self, slot: int) -> None:
        """Free the slot (the owner may reuse it); unmap once retired and nothing is held."""
        with self._lock:
            if self.addr:
                self.words.set_state(slot, FREE)
            self.live -= 1
            last = self.retired and self.live == 0
        if last:
            self._unmap()

    def retire(self) -> None:
        with self._lock:
            self.retired = True
            last = self.live == 0
        if last:
            self._unmap()

    def _unmap(self) -> None:
        if self.addr:
            _libc.munmap(self.addr, self.length)
            self.addr = 0
