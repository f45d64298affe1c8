"""Output forwarding, worker side: what a rank prints travels to the notebook.

``ChannelStream`` replaces ``sys.stdout``/``sys.stderr`` and batches writes from
any thread (flushed 30 ms after the first write into an empty buffer, at once when large, and
before a cell's result is sent; the flusher sleeps while nothing is written: 256 idle ranks
woken 33 times a second took a third of a 2-core machine);
``capture_fds`` catches what bypasses Python (C++ logs, subprocesses) at the file descriptor,
less the torch noise ``patches.quiet`` drops from the notebook's own fd 2.

The notebook side (lines led by the rank's name, live lines, logs) is ``output.router``.
"""

from __future__ import annotations

import codecs
import io
import os
import threading
import time
import weakref
from typing import Any

from ..control.protocol import Output
from ..patches import quiet
from ..wake_flag import WakeFlag

__all__ = ["ChannelStream", "capture_fds"]

_FLUSH_EVERY = 0.03
_FLUSH_SIZE = 1 << 16


class _Streams:
    """This process's streams and the one thread that flushes them all, started with the
    first stream (a worker's, for its life)."""

    def __init__(self) -> None:
        self.all: weakref.WeakSet[ChannelStream] = weakref.WeakSet()
        self.flusher: threading.Thread | None = None
        self.lock = threading.Lock()
        # set by the first write into an empty buffer; not an Event: a print interrupted
        # inside Event.set() left its lock held and hung every later print (wake_flag.py)
        self.wake = WakeFlag()

    def add(self, stream: ChannelStream) -> None:
        with self.lock:
            self.all.add(stream)
            if self.flusher is None:
                self.flusher = threading.Thread(target=_flush_loop, daemon=True,
                                                name="nbdist-output-flusher")
                self.flusher.start()


class ChannelStream(io.TextIOBase):
    """A text stream whose writes travel to the notebook as ``Output`` messages."""

    def __init__(self, channel: Any, rank: int, name: str) -> None:
        self.channel, self.rank, self._name = channel, rank, name
        self._buf: list[str] = []
        self._size = 0
        self._lock = threading.Lock()
        _STREAMS_PER_PROCESS.add(self)

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
            if not self._buf:
                _STREAMS_PER_PROCESS.wake.set()
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
                self.channel.send(Output(self.rank, self._name, text), droppable=True)
            except OSError:
                pass


def _flush_loop() -> None:
    """Wait for a first write, let more come for ``_FLUSH_EVERY``, send them all. A write whose
    wake-up the ``wait`` takes came before it, so the flush after it takes that write."""
    wake = _STREAMS_PER_PROCESS.wake
    while True:
        wake.wait()
        time.sleep(_FLUSH_EVERY)
        for s in list(_STREAMS_PER_PROCESS.all):
            s.flush()


_STREAMS_PER_PROCESS = _Streams()


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
    filtered = name == "stderr"  # torch's C++ chatter nbdist causes (a keep-restart's eof lines)
    held_err, in_block = b"", False
    held_out = ""  # the start of a stdout line that may be noise (Gloo's connection line)
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        if filtered:
            data, held_err, in_block = quiet.filter_chunk(held_err + data, in_block)
        text = decoder.decode(data)
        if name == "stdout":
            text, held_out = quiet.drop_stdout_noise(text, held_out)
        if text:
            try:
                channel.send(Output(rank, name, text), droppable=True)
            except OSError:
                return
