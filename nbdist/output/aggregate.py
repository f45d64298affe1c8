"""Identical lines from many ranks shown once: ``[worker1-12] epoch 3 done``. Pure: no I/O,
no clock (the caller passes ``now``).

``Aggregator`` holds a complete line for at most ``window`` seconds so that the same text from
other ranks on the same stream joins it, shows it at once when every expected rank has printed
it, keeps each rank's lines in the order it printed them, and ``release`` shows a rank's held
lines now. Contract: nothing is dropped; each held line is shown exactly once (the router keeps
every rank's own log as printed). The rule in full: docs/how-it-works.md, Module notes. The
ranks of a shown line are written by ``nbdist.rank_sets.rank_set``.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Aggregator", "Held"]


@dataclass(eq=False)
class Held:
    """One held line: its ``stream``, ``text`` and the ``ranks`` that printed it (in the
    order they did); ``seq`` its creation order, ``pos`` its place in the order lines may be
    shown in, ``start`` when the first rank printed it, ``due`` when it must be shown,
    ``complete`` whether every expected rank has printed it."""

    seq: int
    pos: float
    stream: str
    text: str
    start: float
    due: float
    ranks: list[int] = field(default_factory=list)
    complete: bool = False


class Aggregator:
    """Holds lines for ``window`` seconds to merge equal ones from different ranks.

    Held lines have a place (``pos``) such that each rank's held lines are in the order it
    printed them: a line joins an equal held line only if that line's place is after the
    rank's last held line, and a line that joins none takes a place just after the rank's
    last line (so that the rank can still join the lines after it), or at the end. A
    line due is shown with every held line placed before it; among lines free to go, the
    oldest goes first.
    """

    MAX_HELD = 2000  # held lines beyond this are shown at once, oldest place first

    def __init__(self, window: float) -> None:
        self.window = window
        self._keys: list[tuple[float, int]] = []  # (pos, seq) of every held line, sorted
        self._held: dict[int, Held] = {}  # seq -> line
        self._by_text: dict[tuple[str, str], list[Held]] = {}
        self._of_rank: dict[int, collections.deque[Held]] = {}  # rank -> its held, in order
        self._dues: list[tuple[float, int]] = []  # heap of (due, seq)
        self._last_pos: dict[int, float] = {}  # rank -> the place of its last line, held or not
        self._seq = 0

    def __len__(self) -> int:
        return len(self._held)

    def add(self, rank: int, stream: str, text: str, now: float,
            expected: frozenset[int] | None = None) -> list[Held]:
        """``rank`` printed the line ``text``; returns the lines to show now, in order.

        ``expected``: the ranks that may print it; when all of them have, it goes at once."""
        out: list[Held] = []
        self._show_due(now, out)  # a line whose window ended takes no one more
        mine = self._of_rank.setdefault(rank, collections.deque())
        after = mine[-1].pos if mine else -math.inf
        held = None
        for candidate in self._by_text.get((stream, text), ()):
            if candidate.pos > after and now < candidate.start + self.window and \
                    (held is None or candidate.pos < held.pos):
                held = candidate
        if held is None:
            held = self._new(stream, text, now, after if mine else self._last_pos.get(rank))
        self._last_pos[rank] = held.pos
        held.ranks.append(rank)
        mine.append(held)
        if expected is not None and expected.issubset(held.ranks):
            held.complete = True  # no one else is going to print it
            self._show_ready([held], now, out)
        while len(self._held) > self.MAX_HELD:
            self._force(self._keys[0][0], now, out)
        return out

    def due(self, now: float) -> list[Held]:
        """The lines whose window ended by ``now`` (and what had to come before them)."""
        out: list[Held] = []
        self._show_due(now, out)
        return out

    def next_due(self) -> float | None:
        """When the next held line must be shown (None: nothing held)."""
        while self._dues and self._dues[0][1] not in self._held:
            heapq.heappop(self._dues)
        return self._dues[0][0] if self._dues else None

    def release(self, ranks: Iterable[int] | None = None, now: float = 0.0) -> list[Held]:
        """Show now every held line of ``ranks`` (None: every held line), and the held lines
        that must come before them (then, at ``now``, complete lines they held back)."""
        out: list[Held] = []
        if ranks is None:
            limit = math.inf
        else:
            limit = max((self._of_rank[r][-1].pos for r in ranks if self._of_rank.get(r)),
                        default=-math.inf)
        self._force(limit, now, out)
        return out

    # -- inside -------------------------------------------------------------------------------
    def _new(self, stream: str, text: str, now: float, anchor: float | None) -> Held:
        """A held line placed just after ``anchor`` (the place of the rank's last line), or
        at the end (a rank's first line)."""
        if anchor is None:
            pos = self._keys[-1][0] + 1.0 if self._keys else 0.0
        else:
            i = bisect.bisect_right(self._keys, (anchor, math.inf))
            if i < len(self._keys) and self._keys[i][0] - anchor < 1e-9:
                anchor = self._renumber(anchor)
                i = bisect.bisect_right(self._keys, (anchor, math.inf))
            pos = (anchor + self._keys[i][0]) / 2 if i < len(self._keys) else anchor + 1.0
        self._seq += 1
        held = Held(self._seq, pos, stream, text, now, now + self.window)
        bisect.insort(self._keys, (pos, held.seq))
        self._held[held.seq] = held
        self._by_text.setdefault((stream, text), []).append(held)
        heapq.heappush(self._dues, (held.due, held.seq))
        return held

    def _renumber(self, anchor: float) -> float:
        """Places 0, 1, 2, ... in the same order (places halved too often get too close);
        returns where ``anchor`` is now. The last places of ranks with nothing held move
        with them."""
        old = [pos for pos, _ in self._keys]

        def moved(p: float) -> float:  # among the new places as it was among the old ones
            i = bisect.bisect_left(old, p)
            return float(i) if i < len(old) and old[i] == p else i - 0.5

        self._last_pos = {r: moved(p) for r, p in self._last_pos.items()}
        anchor = moved(anchor)
        for i, (_, seq) in enumerate(self._keys):
            self._held[seq].pos = float(i)
        self._keys = [(float(i), seq) for i, (_, seq) in enumerate(self._keys)]
        return anchor

    def _free(self, held: Held) -> bool:
        """No held line that must come before ``held`` is left."""
        return all(self._of_rank[r][0] is held for r in held.ranks)

    def _show(self, held: Held, out: list[Held]) -> None:
        del self._held[held.seq]
        del self._keys[bisect.bisect_left(self._keys, (held.pos, held.seq))]
        same = self._by_text[(held.stream, held.text)]
        same.remove(held)
        if not same:
            del self._by_text[(held.stream, held.text)]
        for r in held.ranks:
            q = self._of_rank[r]
            q.popleft()
            if not q:
                del self._of_rank[r]
        out.append(held)

    def _force(self, limit: float, now: float, out: list[Held]) -> None:
        """``_show_upto(limit)``, then the complete lines it set free."""
        first = len(out)
        self._show_upto(limit, out)
        freed = {r for h in out[first:] for r in h.ranks}
        self._show_ready([q[0] for r in freed if (q := self._of_rank.get(r))], now, out)

    def _show_upto(self, limit: float, out: list[Held]) -> None:
        """Show every held line placed at or before ``limit``, oldest first among those
        free to go (each rank's order is kept)."""
        end = bisect.bisect_right(self._keys, (limit, math.inf))
        todo = [(h.seq, h) for h in (self._held[seq] for _, seq in self._keys[:end])
                if self._free(h)]
        heapq.heapify(todo)
        while todo:
            _, h = heapq.heappop(todo)
            if h.seq not in self._held or not self._free(h):
                continue
            self._show(h, out)
            for r in h.ranks:
                q = self._of_rank.get(r)
                if q and q[0].pos <= limit and self._free(q[0]):
                    heapq.heappush(todo, (q[0].seq, q[0]))

    def _show_ready(self, candidates: list[Held], now: float, out: list[Held]) -> None:
        """Show each candidate that is complete (or due) and free, oldest first; then
        whatever that showing set free."""
        todo = [(h.seq, h) for h in candidates]
        heapq.heapify(todo)
        while todo:
            _, h = heapq.heappop(todo)
            if h.seq not in self._held or not (h.complete or h.due <= now) or \
                    not self._free(h):
                continue
            self._show(h, out)
            for r in h.ranks:  # each rank's next held line may be free now
                q = self._of_rank.get(r)
                if q:
                    heapq.heappush(todo, (q[0].seq, q[0]))

    def _show_due(self, now: float, out: list[Held]) -> None:
        while True:
            due = self.next_due()
            if due is None or due > now:
                return
            _, seq = heapq.heappop(self._dues)
            self._force(self._held[seq].pos, now, out)  # it, and what must come before it
