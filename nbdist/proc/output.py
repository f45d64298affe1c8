"""Output forwarding: worker streams out, rank-prefixed lines in.

Worker side: ``ChannelStream`` replaces ``sys.stdout``/``sys.stderr`` and batches writes from
any thread (flushed every 30 ms, at once when large, and before a cell's result is sent);
``capture_fds`` catches what bypasses Python (C++ logs, subprocesses) at the file descriptor.

Notebook side: ``Router`` turns chunks into whole lines led by the rank's name, ``[obs2] ...``,
and writes them to whatever ``sys.stdout``/``sys.stderr`` is at that moment, which in a Jupyter
kernel is the cell that is running.
"""

from __future__ import annotations

import codecs
import io
import os
import sys
import threading
import time
import weakref
from typing import Any

from .protocol import Output

__all__ = ["ChannelStream", "Router", "capture_fds"]

_FLUSH_EVERY = 0.03
_FLUSH_SIZE = 1 << 16
PARTIAL_LIMIT = 1 << 16  # characters of one unfinished line the router holds per rank


class ChannelStream(io.TextIOBase):
    """A text stream whose writes travel to the notebook as ``Output`` messages."""

    _all: weakref.WeakSet = weakref.WeakSet()
    _flusher: threading.Thread | None = None

    def __init__(self, channel: Any, rank: int, name: str) -> None:
        self.channel, self.rank, self._name = channel, rank, name
        self._buf: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        ChannelStream._all.add(self)
        if ChannelStream._flusher is None:
            ChannelStream._flusher = threading.Thread(target=_flush_loop, daemon=True,
                                                      name="nbdist-output-flusher")
            ChannelStream._flusher.start()

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"<{self._name}>"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        with self._lock:
            self._buf.append(s)
            self._size += len(s)
            big = self._size >= _FLUSH_SIZE
        if big:
            self.flush()
        return len(s)

    def flush(self) -> None:
        with self._lock:
            if not self._buf:
                return
            text = "".join(self._buf)
            self._buf.clear()
            self._size = 0
            try:
                self.channel.send(Output(self.rank, self._name, text))
            except OSError:
                pass


def _flush_loop() -> None:
    while True:
        time.sleep(_FLUSH_EVERY)
        for s in list(ChannelStream._all):
            s.flush()


def capture_fds(channel: Any, rank: int) -> None:
    """Send what is written to file descriptors 1 and 2 to the notebook as well."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        threading.Thread(target=_pump, args=(r, channel, rank, name), daemon=True,
                         name=f"nbdist-fd{fd}").start()


def _pump(fd: int, channel: Any, rank: int, name: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        text = decoder.decode(data)
        if text:
            try:
                channel.send(Output(rank, name, text))
            except OSError:
                return


class Router:
    """Assembles per-rank chunks into prefixed lines on the notebook's current streams."""

    def __init__(self) -> None:
        self._partial: dict[tuple[int, str], tuple[str, str]] = {}
        self._lock = threading.Lock()
        self.muted = False

    def feed(self, rank: int, name: str, stream: str, text: str) -> None:
        if self.muted:
            return
        with self._lock:
            _, before = self._partial.pop((rank, stream), (name, ""))
            text = before + text
            head, sep, tail = text.rpartition("\n")
            lines = head.split("\n") if sep else []
            while len(tail) > PARTIAL_LIMIT:  # a line without end is shown in pieces
                lines.append(tail[:PARTIAL_LIMIT])
                tail = tail[PARTIAL_LIMIT:]
            if tail:
                self._partial[(rank, stream)] = (name, tail)
            if lines:
                self.write(stream, "".join(f"[{name}] {line}\n" for line in lines))

    def flush(self, rank: int | None = None) -> None:
        """Write out partial lines (all ranks, or one)."""
        with self._lock:
            for key in [k for k in self._partial if rank is None or k[0] == rank]:
                name, tail = self._partial.pop(key)
                self.write(key[1], f"[{name}] {tail}\n")

    @staticmethod
    def write(stream: str, text: str) -> None:
        """Write to the notebook's current stdout or stderr (the running cell in Jupyter)."""
        target = sys.stderr if stream == "stderr" else sys.stdout
        try:
            target.write(text)
            target.flush()
        except (ValueError, OSError):
            pass
