"""Many ranks' curves as one band, pure: at each of ``POINTS`` steps the lowest, the median
and the highest of the ranks' values, and the ranks that stray from the median, named.

Data shapes: ``curves`` ``{rank: (steps, values)}`` (numpy arrays or sequences, steps
rising); a ``Band`` holds the common ``steps`` and ``lo``, ``mid``, ``hi`` on them, and
``strays``, the ranks whose curve lies furthest from the median (most first). Its cost is
ranks × (points of a curve + ``POINTS``), once per picture; what is drawn from it is three
curves and the strays, whatever the number of ranks.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["POINTS", "STRAY", "Band", "band"]

POINTS = 300  # steps of the band
STRAY = 4.0  # how many times the ranks' typical distance from the median makes a stray


@dataclass
class Band:
    """The band of some ranks' curves (see the module docstring)."""

    steps: np.ndarray
    lo: np.ndarray
    mid: np.ndarray
    hi: np.ndarray
    ranks: list[int] = field(default_factory=list)
    strays: list[int] = field(default_factory=list)


def band(curves: dict[int, tuple[Sequence, Sequence]], points: int = POINTS,
         most: int = 3) -> Band:
    """The band of ``curves``, and at most ``most`` strays: ranks whose mean distance from
    the median is over ``STRAY`` times the ranks' median distance."""
    kept = {r: (np.asarray(x, float), np.asarray(y, float)) for r, (x, y) in curves.items()
            if len(y)}
    if not kept:
        empty = np.asarray([])
        return Band(empty, empty, empty, empty)
    ranks = sorted(kept)
    start = min(kept[r][0][0] for r in ranks)
    end = max(kept[r][0][-1] for r in ranks)
    steps = np.linspace(start, end, points) if end > start else np.asarray([start])
    grid = np.stack([np.interp(steps, *kept[r], left=np.nan, right=np.nan) for r in ranks])
    with warnings.catch_warnings():  # a step no rank covers stays NaN: not drawn
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, mid, hi = np.nanmin(grid, 0), np.nanmedian(grid, 0), np.nanmax(grid, 0)
        away = np.nanmean(np.abs(grid - mid), axis=1)
        typical = np.nanmedian(away)
    scale = typical + 1e-9 * (1.0 + float(np.nanmax(np.abs(mid))))
    order = np.argsort(-np.nan_to_num(away, nan=-1.0), kind="stable")
    strays = [ranks[i] for i in order[:most] if away[i] > STRAY * scale]
    return Band(steps, lo, mid, hi, ranks, strays)
