"""What the notebook's cells, interrupts, flushes and stops cost on the wire: control frames
sent to ranks (directly) and to join agents (``Relay``: one frame for a host's ranks).

``Cluster.frames`` is a ``SentFrames``: in all, by message (``"exec"``, ``"interrupt"``, ...)
and by cell (``frames.cell(exec_id)``, ``frames.last_cell``), each a ``FrameCount``.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass

__all__ = ["CELLS_KEPT", "FrameCount", "SentFrames"]

CELLS_KEPT = 100  # cells whose counts are kept


@dataclass
class FrameCount:
    """Frames, and their payload bytes; ``relayed``: how many of them went to an agent."""

    frames: int = 0
    bytes: int = 0
    relayed: int = 0

    def add(self, nbytes: int, relayed: bool) -> None:
        self.frames += 1
        self.bytes += nbytes
        self.relayed += relayed


class SentFrames:
    """Control frames the notebook sent for cells, interrupts, flushes and stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = FrameCount()
        self.by_message: dict[str, FrameCount] = collections.defaultdict(FrameCount)
        self._cells: collections.OrderedDict[int, FrameCount] = collections.OrderedDict()

    def add(self, tag: str, nbytes: int, relayed: bool, exec_id: int | None = None) -> None:
        """One frame of ``nbytes`` carrying a ``tag`` message (to an agent: ``relayed``)."""
        with self._lock:
            self.total.add(nbytes, relayed)
            self.by_message[tag].add(nbytes, relayed)
            if exec_id is not None:
                count = self._cells.get(exec_id)
                if count is None:
                    count = self._cells[exec_id] = FrameCount()
                    while len(self._cells) > CELLS_KEPT:
                        self._cells.popitem(last=False)
                count.add(nbytes, relayed)

    def cell(self, exec_id: int) -> FrameCount:
        """The frames that handed cell ``exec_id`` out (a zero count if none are known)."""
        with self._lock:
            return FrameCount(**vars(self._cells.get(exec_id, FrameCount())))

    @property
    def last_cell(self) -> FrameCount:
        """The frames of the latest cell handed out."""
        with self._lock:
            last = next(reversed(self._cells), None)
        return self.cell(last) if last is not None else FrameCount()

    def message(self, tag: str) -> FrameCount:
        """The frames that carried ``tag`` messages (``"exec"``, ``"interrupt"``, ``"stop"``)."""
        with self._lock:
            return FrameCount(**vars(self.by_message.get(tag, FrameCount())))

    def __repr__(self) -> str:
        return (f"<SentFrames {self.total.frames} frames ({self.total.relayed} relayed), "
                f"{self.total.bytes} bytes>")
