"""Displays for nbdist: pure renderers (``render``) and the live dashboard.

``nbdist.display.dashboard()`` shows per-rank curves of logged values, RPC latency and call
rates, cluster status and batched-vs-unbatched timings, updating while cells run.
``record_timing(observers, mode, seconds)`` feeds the timings chart from any rank.
The dashboard's names load ``live`` (numpy, matplotlib) on first use: ``%load_ext nbdist``
registers ``%dist_dashboard`` from this package without paying for them.
"""

from __future__ import annotations

from typing import Any

from ..telemetry.timing import clear_timings, record_timing, timings

_LIVE = ("Dashboard", "close_all", "dashboard")

__all__ = [
    "Dashboard",
    "clear_timings",
    "close_all",
    "dashboard",
    "record_timing",
    "timings",
]


def __getattr__(name: str) -> Any:
    if name in _LIVE:
        from . import live

        return getattr(live, name)
    raise AttributeError(f"module 'nbdist.display' has no attribute {name!r}")
