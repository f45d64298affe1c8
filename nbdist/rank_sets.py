"""Sets of ranks written compactly, so that what a person reads stays short at 256 ranks:
``worker1-255``, ``ps,trainer2-12``, ``obs1-3,5,learner4``. Pure: strings and ints only.

``rank_set`` writes names (``worker{rank}``, ``obs{rank}``, ...), ``spans`` rank numbers,
``named`` both; ``numbers`` and ``labels`` list ranks one by one up to ``SMALL`` of them, as
small worlds always showed them, and compactly past it;
``grouped`` puts items that are alike together in the order they first came. ``SMALL`` is
the size up to which displays keep listing ranks one by one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

__all__ = ["SMALL", "grouped", "labels", "named", "numbers", "rank_set", "spans"]

#: Up to this many ranks a display lists them one by one; past it, it groups them.
SMALL = 16

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

_NUMBERED = re.compile(r"^(.*?)([1-9][0-9]*|0)$")


def rank_set(names: Iterable[str]) -> str:
    """Names in rank order, written compactly: ``worker1-4,7``, ``ps,trainer2-12``.

    Names that end in a number share their stem once; runs of three or more consecutive
    numbers become ``a-b``. Stems appear in the order of their first rank.
    """
    stems: dict[str, list[int]] = {}
    plain: dict[str, None] = {}
    order: list[tuple[str, bool]] = []
    for name in names:
        m = _NUMBERED.match(name)
        if m is None:
            if name not in plain:
                plain[name] = None
                order.append((name, False))
            continue
        stem, num = m.group(1), int(m.group(2))
        if stem not in stems:
            stems[stem] = []
            order.append((stem, True))
        stems[stem].append(num)
    return ",".join(key + spans(stems[key]) if numbered else key for key, numbered in order)


def spans(nums: Iterable[int]) -> str:
    """Numbers sorted, runs of three or more as ``a-b``: ``[1, 2, 3, 5, 7, 8]`` ->
    ``1-3,5,7,8``."""
    ordered = sorted(set(nums))
    out: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{ordered[i]}-{ordered[j]}")
        else:
            out.extend(str(n) for n in ordered[i:j + 1])
        i = j + 1
    return ",".join(out)


def named(ranks: Iterable[tuple[int, str]]) -> str:
    """``(rank, name)`` pairs: ``rank 2 (worker2)`` for one, ``ranks 1-3,5 (worker1-3,5)``
    for several."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0][0]} ({ordered[0][1]})"
    return f"ranks {spans(r for r, _ in ordered)} ({rank_set(n for _, n in ordered)})"


def numbers(ranks: Iterable[int], small: int = SMALL) -> str:
    """``1, 3, 4`` up to ``small`` ranks; past it ``spans`` (``1-255``)."""
    ordered = sorted(ranks)
    return ", ".join(map(str, ordered)) if len(ordered) <= small else spans(ordered)


def labels(ranks: Iterable[tuple[int, str]], small: int = SMALL) -> str:
    """``rank 1 (worker1), rank 3 (worker3)`` up to ``small`` ranks; past it their count and
    ``named``: ``255 ranks 1-255 (worker1-255)``."""
    pairs = list(ranks)
    if len(pairs) <= small:
        return ", ".join(f"rank {r} ({n})" for r, n in pairs)
    return f"{len(pairs)} {named(pairs)}"


def grouped(items: Iterable[T], key: Callable[[T], K]) -> list[tuple[K, list[T]]]:
    """``items`` by ``key``: one ``(key, members)`` per distinct key, in the order each key
    first came, members in their order."""
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.items())
