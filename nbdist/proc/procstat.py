"""CPU % and memory of processes by pid (psutil), for ``%dist_status``: the notebook samples
its local ranks and the template, a join agent its own host's ranks (sent with each
heartbeat, since a pid on another host means nothing here)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["Sampler"]


class Sampler:
    """Keeps a ``psutil.Process`` per pid, so that ``cpu_percent`` is measured since the
    previous sample of that pid (the first sample of a pid reads 0)."""

    def __init__(self) -> None:
        self._procs: dict[int, Any] = {}

    def sample(self, pid: int | None) -> tuple[float | None, float | None]:
        """``(cpu %, resident memory MB)`` of ``pid``; ``(None, None)`` if it cannot be read
        (gone, not ours, psutil missing)."""
        if pid is None:
            return None, None
        try:
            import psutil

            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
                proc.cpu_percent(None)
            return proc.cpu_percent(None), proc.memory_info().rss / 2**20
        except Exception:  # noqa: BLE001 - a status figure, never an error
            self._procs.pop(pid, None)
            return None, None

    def keep_only(self, pids: Iterable[int]) -> None:
        """Forget every pid but these (processes that ended)."""
        keep = set(pids)
        for pid in [p for p in self._procs if p not in keep]:
            del self._procs[pid]
