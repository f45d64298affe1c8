"""Batched-vs-unbatched timings for the dashboard's bar chart.

``record_timing(observers, mode, seconds)`` from any rank: on the notebook the timing is stored
here, on a worker it travels to the notebook with the next metrics batch (an internal record,
so it never shows in ``history()``). Records logged with the keys in ``LOG_KEYS`` count as
timings as well. The batching tutorial and ``bench/rpc/batching.py`` call it,
for example ``record_timing(4, "batch", 17.6)`` and ``record_timing(4, "no batch", 28.9)``.
"""

from __future__ import annotations

import time

from . import records
from .counted_log import CountedLog

__all__ = ["LOG_KEYS", "clear_timings", "from_record", "record_timing", "timings",
           "timings_version"]

#: ``nbdist.log(batching_observers=4, batching_mode="batched", batching_seconds=17.6)`` is read
#: as a timing too (``nbdist.tutorials.batching.record`` logs those): the dashboard draws such
#: records as bars, not as curves.
LOG_KEYS = ("batching_observers", "batching_mode", "batching_seconds")

_TIMINGS_PER_PROCESS = CountedLog()


def record_timing(observers: int, mode: str, seconds: float) -> None:
    """Record that a run with ``observers`` observers in ``mode`` took ``seconds``."""
    if not isinstance(observers, int) or observers < 0:
        raise ValueError(f"record_timing: observers must be a whole number >= 0, got "
                         f"{observers!r}")
    if not isinstance(mode, str) or not mode:
        raise ValueError(f"record_timing: mode must be a name such as 'batch', got {mode!r}")
    row = {"observers": observers, "mode": mode, "seconds": float(seconds), "time": time.time(),
           "rank": records.identity()[0]}
    records.send_internal("timing", row=row)


def _add(row: dict) -> None:
    _TIMINGS_PER_PROCESS.add(row)


def _receive(rec: dict) -> None:
    _add(rec["row"])


records.register_internal("timing", _receive)


def from_record(rec: dict) -> dict | None:
    """The timing a logged record carries (``LOG_KEYS``), or None."""
    if LOG_KEYS[2] not in rec:
        return None
    try:
        return {"observers": int(rec.get(LOG_KEYS[0], 0)), "mode": str(rec.get(LOG_KEYS[1], "")),
                "seconds": float(rec[LOG_KEYS[2]]), "time": rec.get("time"),
                "rank": rec.get("rank")}
    except (TypeError, ValueError):
        return None


def timings() -> list[dict]:
    """Copies of every recorded timing: ``observers``, ``mode``, ``seconds``, ``time``, ``rank``."""
    return _TIMINGS_PER_PROCESS.items()


timings_version = _TIMINGS_PER_PROCESS.changes  # moves when a timing is recorded or cleared
clear_timings = _TIMINGS_PER_PROCESS.clear  # forget every recorded timing
