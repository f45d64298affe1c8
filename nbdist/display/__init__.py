"""Displays for nbdist: pure renderers (``render``) and the live dashboard.

``nbdist.display.dashboard()`` shows per-rank curves of logged values, RPC latency and call
rates, cluster status and batched-vs-unbatched timings, updating while cells run.
``record_timing(observers, mode, seconds)`` feeds the timings chart from any rank.
"""

from __future__ import annotations

from ..telemetry.timing import clear_timings, record_timing, timings
from .live import Dashboard, close_all, dashboard

__all__ = [
    "Dashboard",
    "clear_timings",
    "close_all",
    "dashboard",
    "record_timing",
    "timings",
]
