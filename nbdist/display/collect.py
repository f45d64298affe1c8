"""``SeriesStore``: the dashboard's own view of the logged values, per value and rank.

It follows the metrics stream, so a picture never walks the history. Each curve is an
``Envelope``: at most ``MAX_BUCKETS`` buckets of consecutive points, each keeping its lowest
and highest point, its last step and its sum and count. When the buckets run out, neighbours
merge (the width doubles), so memory and drawing cost stay flat however long a run logs,
while every spike (a bucket's min and max) stays on the picture. Up to ``MAX_BUCKETS`` points
a curve is exact.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..telemetry.records import META, Table, follow_with, generation, unsubscribe
from ..telemetry.timing import LOG_KEYS, from_record

__all__ = ["Curve", "Envelope", "MAX_BUCKETS", "SeriesStore"]

MAX_BUCKETS = 700  # per curve: at most 2 * 700 + 2 points drawn
_NUMBER = (int, float)


class Curve(tuple):
    """A downsampled curve ready to draw: ``(steps, values, mean_steps, mean_values)``."""

    __slots__ = ()

    def __new__(cls, x: Any, y: Any, mx: Any, my: Any) -> Curve:
        return super().__new__(cls, (x, y, mx, my))


class Envelope:
    """One curve at bounded size (see the module docstring); ``append`` is O(1) amortised."""

    __slots__ = ("cap", "width", "first", "last", "xmin", "ymin", "xmax", "ymax", "xlast",
                 "sums", "counts")

    def __init__(self, cap: int = MAX_BUCKETS) -> None:
        self.cap = max(2, cap - cap % 2)
        self.width = 1
        self.first: tuple | None = None
        self.last: tuple | None = None
        self.xmin: list = []
        self.ymin: list = []
        self.xmax: list = []
        self.ymax: list = []
        self.xlast: list = []
        self.sums: list = []
        self.counts: list = []

    def __len__(self) -> int:
        return sum(self.counts)

    def append(self, x: Any, y: float) -> None:
        """Add one point (NaN values are skipped)."""
        if y != y:
            return
        if self.first is None:
            self.first = (x, y)
        self.last = (x, y)
        counts = self.counts
        if counts and counts[-1] < self.width:
            if y < self.ymin[-1]:
                self.xmin[-1], self.ymin[-1] = x, y
            if y > self.ymax[-1]:
                self.xmax[-1], self.ymax[-1] = x, y
            self.xlast[-1] = x
            self.sums[-1] += y
            counts[-1] += 1
            return
        if len(counts) >= self.cap:
            self._halve()
        self._new(x, y, x, y, x, y, 1)

    def _new(self, x0: Any, y0: float, x1: Any, y1: float, xl: Any, s: float, n: int) -> None:
        self.xmin.append(x0)
        self.ymin.append(y0)
        self.xmax.append(x1)
        self.ymax.append(y1)
        self.xlast.append(xl)
        self.sums.append(s)
        self.counts.append(n)

    def _halve(self) -> None:
        """Merge neighbouring buckets: half as many, twice as wide."""
        cols = (self.xmin, self.ymin, self.xmax, self.ymax, self.xlast, self.sums, self.counts)
        old = [list(c) for c in cols]
        for c in cols:
            c.clear()
        for i in range(0, len(old[6]) - 1, 2):
            j = i + 1
            lo = i if old[1][i] <= old[1][j] else j
            hi = i if old[3][i] >= old[3][j] else j
            self._new(old[0][lo], old[1][lo], old[2][hi], old[3][hi], old[4][j],
                      old[5][i] + old[5][j], old[6][i] + old[6][j])
        self.width *= 2

    def extend(self, x: np.ndarray, y: np.ndarray) -> None:
        """Add many points at once (vectorised when this envelope is still empty)."""
        keep = ~np.isnan(y)
        x, y = x[keep], y[keep]
        if self.counts or y.size <= self.cap:
            for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
                self.append(xi, yi)
            return
        width = 1 << max(0, math.ceil(math.log2(y.size / self.cap)))
        while -(-y.size // width) > self.cap:
            width *= 2
        self.width = width
        full = y.size // width * width
        self._bulk(x[:full].reshape(-1, width), y[:full].reshape(-1, width))
        if full < y.size:
            self._bulk(x[full:].reshape(1, -1), y[full:].reshape(1, -1))
        self.first = (x[0].item(), float(y[0]))
        self.last = (x[-1].item(), float(y[-1]))

    def _bulk(self, x: np.ndarray, y: np.ndarray) -> None:
        rows = np.arange(y.shape[0])
        lo, hi = y.argmin(axis=1), y.argmax(axis=1)
        self.xmin += x[rows, lo].tolist()
        self.ymin += y[rows, lo].tolist()
        self.xmax += x[rows, hi].tolist()
        self.ymax += y[rows, hi].tolist()
        self.xlast += x[:, -1].tolist()
        self.sums += y.sum(axis=1).tolist()
        self.counts += [y.shape[1]] * y.shape[0]

    def exact(self) -> bool:
        """Whether every point is still kept as it was logged."""
        return self.width == 1

    def points(self) -> tuple[list, list]:
        """Exact curves: copies of the steps and values."""
        return list(self.xlast), list(self.sums)

    def curve(self, window: int) -> Curve:
        """The points to draw: each bucket's min and max (in step order), the first and the
        last point, and a trailing mean over about ``window`` points at each bucket's end."""
        xmin, xmax = np.asarray(self.xmin), np.asarray(self.xmax)
        ymin, ymax = np.asarray(self.ymin, float), np.asarray(self.ymax, float)
        swap = xmax < xmin
        x = np.column_stack([np.where(swap, xmax, xmin), np.where(swap, xmin, xmax)]).ravel()
        y = np.column_stack([np.where(swap, ymax, ymin), np.where(swap, ymin, ymax)]).ravel()
        assert self.first is not None and self.last is not None
        x = np.concatenate([[self.first[0]], x, [self.last[0]]])
        y = np.concatenate([[self.first[1]], y, [self.last[1]]])
        m = max(1, round(window / self.width))
        s = np.concatenate([[0.0], np.cumsum(self.sums)])
        c = np.concatenate([[0], np.cumsum(self.counts)])
        hi = np.arange(1, len(self.counts) + 1)
        lo = np.maximum(hi - m, 0)
        return Curve(x, y, np.asarray(self.xlast), (s[hi] - s[lo]) / (c[hi] - c[lo]))


class SeriesStore:
    """``{value name: {rank: Envelope}}`` for every numeric value logged.

    Records that carry a timing (``timing.LOG_KEYS``) go to ``timings`` instead.
    """

    def __init__(self, cap: int = MAX_BUCKETS) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._series: dict[str, dict[int, Envelope]] = {}
        self.names: dict[int, str] = {}
        self.timings: list[dict] = []  # records logged with timing.LOG_KEYS
        self.timings_version = 0
        self.version = 0
        self.count = 0
        self._generation = -1
        self._attached = False

    def attach(self) -> None:
        """Load the history so far and follow the stream (``detach`` stops following)."""
        with self._lock:  # deliveries wait until the history is in, so order is kept
            self._series.clear()
            self.timings.clear()
            self.timings_version += 1
            self.count = 0
            _, self._generation = follow_with(self.add, self._load)
            self._attached = True
            self.version += 1

    def _load(self, table: Table) -> None:
        """Build the envelopes from the history's columns (under the history's lock)."""
        self.count = len(table)
        self.names.update(table.last_names())
        timing_col = table.columns.get(LOG_KEYS[2])
        if timing_col is not None:
            for rec in table.rows(list(timing_col.idx)):
                self._add_timing(rec)
        for key, rank, steps, values in table.numeric_curves(skip=LOG_KEYS):
            env = self._series.setdefault(key, {})[rank] = Envelope(self.cap)
            env.extend(steps, values)

    def detach(self) -> None:
        """Stop following the metrics stream."""
        unsubscribe(self.add)
        self._attached = False

    def add(self, records: Sequence[dict]) -> None:
        """Append a batch of records (the metrics subscriber)."""
        with self._lock:
            self._add(records)

    def _add_timing(self, rec: dict) -> bool:
        row = from_record(rec)
        if row is None:
            return False
        self.timings.append(row)
        self.timings_version += 1
        return True

    def _add(self, records: Sequence[dict]) -> None:
        series, names, cap = self._series, self.names, self.cap
        for rec in records:
            rank = rec["rank"]
            step = rec["step"]
            if rank not in names or names[rank] != rec["name"]:
                names[rank] = rec["name"]
            if LOG_KEYS[2] in rec and self._add_timing(rec):
                continue
            for key, v in rec.items():
                if key in META or type(v) not in _NUMBER:
                    continue
                per = series.get(key)
                if per is None:
                    per = series[key] = {}
                env = per.get(rank)
                if env is None:
                    env = per[rank] = Envelope(cap)
                env.append(step, v)
        self.count += len(records)
        self.version += 1

    def timing_rows(self) -> list[dict]:
        """Copies of the timings logged as records."""
        with self._lock:
            return [dict(t) for t in self.timings]

    def keys(self) -> list[str]:
        """Value names in the order they were first seen."""
        with self._lock:
            return list(self._series)

    def _fresh(self) -> None:
        if self._attached and self._generation != generation():
            self.attach()

    def snapshot(self, keys: Sequence[str] | None = None,
                 window: int = 20) -> dict[str, dict[int, tuple]]:
        """The curves of ``keys`` (all if None): ``(steps, values)`` lists while a curve is
        exact, else a downsampled ``Curve`` (with its running mean over ``window``). Starts
        over after ``clear_history``."""
        self._fresh()
        with self._lock:
            wanted = list(self._series) if keys is None else list(keys)
            return {k: {r: env.points() if env.exact() else env.curve(window)
                        for r, env in self._series.get(k, {}).items() if env.counts}
                    for k in wanted}
