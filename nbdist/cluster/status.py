"""``%dist_status``: one row per rank, as a text table and as HTML in a notebook."""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["StatusTable", "collect_status"]

_procs: dict[int, Any] = {}  # pid -> psutil.Process, so cpu_percent has a baseline


def _sample(pid: int | None) -> tuple[float | None, float | None]:
    if pid is None:
        return None, None
    try:
        import psutil

        proc = _procs.get(pid)
        if proc is None:
            proc = _procs[pid] = psutil.Process(pid)
            proc.cpu_percent(None)
        return proc.cpu_percent(None), proc.memory_info().rss / 2**20
    except Exception:
        _procs.pop(pid, None)
        return None, None


@dataclass
class StatusTable:
    """Rows of ``rank, name, pid, state, cpu %, memory MB, uptime s``."""

    rows: list[dict]

    COLUMNS = ("rank", "name", "pid", "state", "cpu %", "mem MB", "uptime s")

    def _cells(self, row: dict) -> list[str]:
        def num(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        return [str(row["rank"]), row["name"], str(row["pid"] or "-"), row["state"],
                num(row["cpu"], ".0f"), num(row["mem_mb"], ".0f"), num(row["uptime"], ".1f")]

    def __str__(self) -> str:
        table = [list(self.COLUMNS)] + [self._cells(r) for r in self.rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(self.COLUMNS))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True))
                         .rstrip() for line in table)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.COLUMNS)
        body = []
        for r in self.rows:
            color = "" if r["alive"] else ' style="color:#b00"'
            cells = "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(r))
            body.append(f"<tr{color}>{cells}</tr>")
        return f"<table class='nbdist-status'><tr>{head}</tr>{''.join(body)}</table>"

    def alive(self) -> dict[int, bool]:
        return {r["rank"]: r["alive"] for r in self.rows}


def collect_status(cluster: Any) -> StatusTable:
    now = time.time()
    rows = []
    for rank in sorted(cluster.ranks):
        info = cluster.ranks[rank]
        alive = info.alive and (rank == 0 or cluster.running)
        cpu, mem = _sample(info.pid) if alive else (None, None)
        if rank == 0:
            state = "notebook"
        elif alive:
            state = "alive" if info.ready else "starting"
        else:
            state = info.reason() if info.exit_code is not None else "stopped"
        rows.append({"rank": rank, "name": info.name, "pid": info.pid, "alive": alive,
                     "state": state, "cpu": cpu, "mem_mb": mem,
                     "uptime": now - info.started if alive else None,
                     "exit_code": info.exit_code})
    return StatusTable(rows)
