"""``%dist_status`` of a big world, pure: rows of ranks that look alike become one row per
host and state (``worker1-255  255  alive  cpu 0-2``), the odd ones out first, one by one.

Input: ``collect_status``'s rows (dicts with ``rank``, ``name``, ``host``, ``pid``, ``alive``,
``state``, ``cpu``, ``mem_mb``, ``uptime``, and ``gpu_mb`` / ``shm`` where measured).
Output: ``Line``s in the order shown. A rank is odd when it is not an alive worker (rank 0,
the template, a dead, stopped or starting rank) or when its CPU or memory stands out from the
median of the alive workers (``outliers``). Odd rows are listed one by one, unless more than
``SMALL`` share a host and a state (a world whose 255 ranks all died reads as one line).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ..rank_sets import SMALL, grouped, rank_set, spans

__all__ = ["Line", "group_rows", "outliers"]

#: How far above the workers' median a rank's CPU % (points) or memory (MB) must be, and
#: how many times the median, to be named on a line of its own.
CPU_ABOVE, MEM_ABOVE, TIMES = 25.0, 256.0, 1.5


@dataclass
class Line:
    """One line of the grouped table: the ``rows`` it stands for (alike, or one odd rank,
    or many odd ranks of one state) and ``note``: why an alive rank stands out ("" if not)."""

    rows: list[dict]
    note: str = ""

    @property
    def state(self) -> str:
        return f"{self.rows[0]['state']}, {self.note}" if self.note else self.rows[0]["state"]

    @property
    def ranks(self) -> str:
        return spans(r["rank"] for r in self.rows) if _ranks(self.rows) else "-"

    @property
    def names(self) -> str:
        return rank_set(r["name"] for r in sorted(self.rows, key=_order))

    def values(self, key: Callable[[dict], float | None], fmt: str) -> str:
        """The rows' values of ``key`` as ``a`` or ``min-max`` (``-``: none known)."""
        got = [v for v in map(key, self.rows) if v is not None]
        if not got:
            return "-"
        lo, hi = format(min(got), fmt), format(max(got), fmt)
        return lo if lo == hi else f"{lo}-{hi}"


def _ranks(rows: list[dict]) -> bool:
    return all(isinstance(r["rank"], int) for r in rows)


def _order(row: dict) -> tuple:
    return (0, row["rank"]) if isinstance(row["rank"], int) else (1, 0)


def _worker(row: dict) -> bool:
    return isinstance(row["rank"], int) and row["rank"] != 0 and row["state"] == "alive"


def outliers(rows: list[dict]) -> dict[int, str]:
    """``{rank: why}`` for alive workers whose CPU or memory stands out from the median of
    all alive workers': ``cpu 98 %`` / ``mem 4100 MB`` (well above both ``TIMES`` the
    median and the median plus ``CPU_ABOVE`` / ``MEM_ABOVE``)."""
    workers = [r for r in rows if _worker(r)]
    out: dict[int, str] = {}
    for key, above, unit in (("cpu", CPU_ABOVE, "%"), ("mem_mb", MEM_ABOVE, "MB")):
        known = [r[key] for r in workers if r.get(key) is not None]
        if len(known) < 3:
            continue
        mid = statistics.median(known)
        for r in workers:
            v = r.get(key)
            if v is not None and v > mid + above and v > mid * TIMES:
                word = "cpu" if key == "cpu" else "mem"
                out[r["rank"]] = ", ".join(filter(None, (out.get(r["rank"]),
                                                         f"{word} {v:.0f} {unit}")))
    return out


def group_rows(rows: list[dict], small: int = SMALL) -> list[Line]:
    """``rows`` as lines, host by host in the order of their first rank: first the odd
    ones (one by one, or grouped by state past ``small`` of one state; rank 0 and the dead
    or stopped before the alive that stand out), then one line per
    state of the alike ranks. The template's row, if any, comes last."""
    standing = outliers(rows)
    lines: list[Line] = []
    for _, of_host in grouped(sorted(rows, key=_order), lambda r: r.get("host") or ""):
        odd = sorted((r for r in of_host if not _worker(r) or r["rank"] in standing),
                     key=lambda r: r["rank"] in standing)  # the dead before the busy
        alike = [r for r in of_host if _worker(r) and r["rank"] not in standing]
        for key, same in grouped(odd, lambda r: (r["state"], r["rank"] in standing)):
            if len(same) > small:
                lines.append(Line(same, "high cpu or memory" if key[1] else ""))
            else:
                lines += [Line([r], standing.get(r["rank"], "")) for r in same]
        lines += [Line(same) for _, same in grouped(alike, lambda r: r["state"])]
    return sorted(lines, key=lambda line: not _ranks(line.rows))  # the template's last
