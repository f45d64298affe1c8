"""``SeriesStore``: the dashboard's own copy of the logged values, kept per value and rank.

It subscribes to the metrics stream, so building a picture never walks the whole history:
each delivered batch costs a few list appends, and a snapshot copies the lists it needs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..telemetry.records import META, follow, generation, unsubscribe
from ..telemetry.timing import from_record

__all__ = ["SeriesStore"]

_NUMBER = (int, float)


class SeriesStore:
    """``{value name: {rank: (steps, values)}}`` for every numeric value logged.

    Records that carry a timing (``timing.LOG_KEYS``) go to ``timings`` instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._series: dict[str, dict[int, tuple[list, list]]] = {}
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
            rows, self._generation = follow(self.add)
            self._attached = True
            self._add(rows)

    def detach(self) -> None:
        """Stop following the metrics stream."""
        unsubscribe(self.add)
        self._attached = False

    def add(self, records: Sequence[dict]) -> None:
        """Append a batch of records (the metrics subscriber)."""
        with self._lock:
            self._add(records)

    def _add(self, records: Sequence[dict]) -> None:
        series, names = self._series, self.names
        for rec in records:
            rank = rec["rank"]
            step = rec["step"]
            if rank not in names or names[rank] != rec["name"]:
                names[rank] = rec["name"]
            if "batching_seconds" in rec:
                row = from_record(rec)
                if row is not None:
                    self.timings.append(row)
                    self.timings_version += 1
                    continue
            for key, v in rec.items():
                if key in META or type(v) not in _NUMBER:
                    continue
                per = series.get(key)
                if per is None:
                    per = series[key] = {}
                curve = per.get(rank)
                if curve is None:
                    curve = per[rank] = ([], [])
                curve[0].append(step)
                curve[1].append(v)
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

    def snapshot(self, keys: Sequence[str] | None = None) -> dict[str, dict[int, tuple]]:
        """Copies of the curves of ``keys`` (all if None); starts over after clear_history."""
        if self._attached and self._generation != generation():
            self.attach()
        with self._lock:
            wanted = list(self._series) if keys is None else [k for k in keys]
            return {k: {r: (list(c[0]), list(c[1])) for r, c in self._series.get(k, {}).items()}
                    for k in wanted}
