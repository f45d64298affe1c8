"""The relay, on a join agent: its ranks' cells, interrupts and stops through one frame.

The notebook sends the agent one ``Relay`` frame for many of its ranks; the agent writes the
frame inside, as it came, to each rank's pipe (a socketpair made before the fork: only the
agent and that rank hold it, so there is nothing to authenticate). What the ranks send back
on their pipes (a relayed cell's output, displays and results) is batched for ``WINDOW``
seconds into one ``Relayed`` frame, an ``Output`` several ranks sent alike once with all
their ranks. A batch holding an answer to a relayed cell (``Result``) or view call
(``Returned``) waits, up to ``HOLD`` seconds, for the other ranks here to answer it too (an
error goes after the window), and goes as soon as they all have, so a cell or a call to 16
ranks of a host is answered by about one frame, with no window added to its time. Each
rank's frames keep their order.
"""

from __future__ import annotations

import socket
import time

from ..control.channel import Channel
from ..control.protocol import (
    Call,
    Exec,
    Message,
    Output,
    ProtocolError,
    Relay,
    Relayed,
    Result,
    Returned,
    decode,
)
from ..fd_wait import readable

__all__ = ["HOLD", "WINDOW", "RankPipes"]

WINDOW = 0.03  # seconds a batch gathers before it goes (a rank's own output flushes as often)
HOLD = 0.25  # at most this long for the other ranks of a cell or call answered in the batch
BATCH_BYTES = 4 << 20  # a batch this big goes at once
WRITE_TIMEOUT = 5.0  # a rank that reads nothing for this long loses its pipe


class _Entry:
    """One frame of the batch, for ``ranks`` (several: equal output)."""

    __slots__ = ("key", "payload", "ranks")

    def __init__(self, rank: int, payload: bytes, key: tuple | None) -> None:
        self.ranks, self.payload, self.key = [rank], payload, key


class RankPipes:
    """The agent's ends of its ranks' pipes, and the batch going back to the notebook."""

    def __init__(self) -> None:
        self._chan: dict[int, Channel] = {}  # pid -> its pipe
        self._rank: dict[int, int] = {}  # pid -> rank
        self._pid: dict[int, int] = {}  # rank -> pid of its newest process
        self._by_fd: dict[int, int] = {}  # fd -> pid
        self._forking: tuple[socket.socket, socket.socket] | None = None
        self._batch: list[_Entry] = []
        self._bytes = 0
        self._since = 0.0
        self._last: dict[int, int] = {}  # rank -> index of its last entry in the batch
        self._equal: dict[tuple, int] = {}  # (stream, text) -> index of the latest such entry
        self._urgent = False  # an error is in the batch: it goes after the window
        self._answered_in: set[tuple] = set()  # cells and calls with an answer in the batch
        self._waiting: dict[tuple, set[int]] = {}  # a relayed cell or call -> ranks yet to
        # answer it (keys: ``_asked``'s)
        self.sent = 0  # ``Relayed`` frames sent, for tests

    # -- forking ------------------------------------------------------------------------------
    def before_fork(self) -> int:
        """A new pipe; returns the child's end's file descriptor."""
        if self._forking is not None:  # the last fork failed: its pipe is not kept
            for sock in self._forking:
                sock.close()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._forking = (mine, theirs)
        return theirs.fileno()

    def in_child(self) -> None:
        """In the forked rank: close the agent's ends, every rank's (no shutdown: the
        parent's sockets stay open), keeping the child's own end."""
        for chan in self._chan.values():
            chan.sock.close()
        if self._forking is not None:
            self._forking[0].close()

    def forked(self, rank: int, pid: int) -> None:
        """In the agent, after the fork: keep this end as ``rank``'s pipe."""
        assert self._forking is not None
        mine, theirs = self._forking
        self._forking = None
        theirs.close()
        chan = Channel(mine, threaded=False, name=f"rank {rank}")
        mine.settimeout(WRITE_TIMEOUT)
        self._chan[pid], self._rank[pid], self._pid[rank] = chan, rank, pid
        self._by_fd[chan.fileno()] = pid

    def fds(self) -> list[int]:
        return list(self._by_fd)

    # -- notebook -> ranks --------------------------------------------------------------------
    def forward(self, msg: Relay) -> None:
        """Write the relayed frame to each of its ranks that has a pipe here."""
        try:
            inner = decode(msg.payload)
        except ProtocolError:
            inner = None  # passed on all the same: each rank reports it
        ranks = [r for r in msg.ranks if self._pid.get(r) in self._chan]
        asked = _asked(inner)
        if asked is not None and ranks:
            self._waiting[asked] = set(ranks)
        for r in ranks:
            pid = self._pid[r]
            try:
                self._chan[pid].send_frame(msg.payload)
            except OSError:
                self._close(pid)

    # -- ranks -> notebook --------------------------------------------------------------------
    def read(self, fd: int) -> None:
        """Take the frame waiting on pipe ``fd`` into the batch (its end: close the pipe)."""
        pid = self._by_fd.get(fd)
        if pid is None:
            return
        try:
            payload = self._chan[pid].recv_payload()
        except (EOFError, OSError):
            self._close(pid)
            return
        self._add(self._rank[pid], payload)

    def _add(self, rank: int, payload: bytes) -> None:
        try:
            msg = decode(payload)
        except ProtocolError:
            msg = None  # the notebook decodes it again and names the rank
        if not self._batch:
            self._since = time.monotonic()
        key = (msg.stream, msg.text) if isinstance(msg, Output) else None
        at = self._equal.get(key, -1) if key is not None else -1
        if at > self._last.get(rank, -1) and rank not in self._batch[at].ranks:
            self._batch[at].ranks.append(rank)  # after its own last entry: order is kept
            self._last[rank] = at
            return
        self._batch.append(_Entry(rank, payload, key))
        self._bytes += len(payload)
        self._last[rank] = len(self._batch) - 1
        if key is not None:
            self._equal[key] = len(self._batch) - 1
        answer = _answer(msg)
        if answer is not None:
            self._answered(answer, rank)
            self._answered_in.add(answer)
            self._urgent = self._urgent or msg.status != "ok"  # type: ignore[union-attr]

    def _answered(self, asked: tuple, rank: int) -> None:
        waiting = self._waiting.get(asked)
        if waiting is not None:
            waiting.discard(rank)
            if not waiting:
                del self._waiting[asked]

    def due_in(self, now: float) -> float | None:
        """Seconds until the batch is due (None: nothing is batched)."""
        if not self._batch:
            return None
        age = now - self._since
        if self._bytes >= BATCH_BYTES:
            return 0.0
        if self._answered_in and not any(a in self._waiting for a in self._answered_in):
            return 0.0  # every rank here answered: the cell or call is not kept waiting
        if not self._urgent and self._answered_in:
            return max(HOLD - age, 0.0)
        return max(WINDOW - age, 0.0)

    def flush(self, chan: Channel, force: bool = False) -> None:
        """Send the batch to the notebook if it is due (``force``: now)."""
        due = self.due_in(time.monotonic())
        if due is None or (due > 0 and not force):
            return
        entries = tuple((tuple(e.ranks), e.payload) for e in self._batch)
        self._batch, self._bytes, self._urgent = [], 0, False
        self._last.clear()
        self._equal.clear()
        self._answered_in.clear()
        chan.send(Relayed(entries))
        self.sent += 1

    def exited(self, pid: int, chan: Channel) -> None:
        """Rank process ``pid`` ended: what it sent last goes to the notebook now, before
        the agent reports its exit."""
        pipe = self._chan.get(pid)
        if pipe is not None:
            while pid in self._chan and readable((pipe.fileno(),), 0):
                self.read(pipe.fileno())
            self._close(pid)
        self.flush(chan, force=True)

    def _close(self, pid: int) -> None:
        chan = self._chan.pop(pid, None)
        rank = self._rank.pop(pid, None)
        if chan is None:
            return
        self._by_fd.pop(chan.fileno(), None)
        if rank is not None and self._pid.get(rank) == pid:
            del self._pid[rank]
            for asked in list(self._waiting):
                self._answered(asked, rank)  # it will not answer
        chan.sock.close()


def _asked(msg: Message | None) -> tuple | None:
    """What a relayed frame asks its ranks to answer: ``("cell", id)``, ``("call", id)``."""
    if isinstance(msg, Exec):
        return ("cell", msg.exec_id)
    if isinstance(msg, Call):
        return ("call", msg.call_id)
    return None


def _answer(msg: Message | None) -> tuple | None:
    """What a rank's frame answers (``_asked``'s key), or None."""
    if isinstance(msg, Result):
        return ("cell", msg.exec_id)
    if isinstance(msg, Returned):
        return ("call", msg.call_id)
    return None
