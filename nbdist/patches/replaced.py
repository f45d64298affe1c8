"""What the patch features replaced in torch and cloudpickle, so each can be put back.

``replace(feature, owner, name, new)`` sets ``owner.name = new`` and remembers what was there
(or that nothing was: an instance attribute over a method); ``restore(feature)`` puts each of
the feature's originals back, newest first. Two features that wrap one attribute stack, so
they are restored in the reverse of their install order (``installed_features`` gives it): a
feature with another's value on top of one of its own is left whole, and ``restore`` names
what covers it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["installed_features", "replace", "restore"]

_ABSENT = object()  # no attribute of its own there before (``delattr`` puts that back)


@dataclass
class _Swap:
    feature: str
    owner: Any
    name: str
    original: Any
    new: Any


class _Swaps:
    """Every replacement in force in this process, oldest first."""

    def __init__(self) -> None:
        self.swaps: list[_Swap] = []
        self.lock = threading.Lock()


_SWAPS_PER_PROCESS = _Swaps()


def _own(owner: Any, name: str) -> Any:
    """``owner``'s own ``name`` (not one it inherits), or ``_ABSENT``."""
    try:
        return vars(owner).get(name, _ABSENT)
    except TypeError:  # no __dict__: a slot or a C-level attribute
        return getattr(owner, name, _ABSENT)


def replace(feature: str, owner: Any, name: str, new: Any) -> Any:
    """Set ``owner.name`` to ``new`` for ``feature``; what it was before (as read)."""
    with _SWAPS_PER_PROCESS.lock:
        before = getattr(owner, name)
        _SWAPS_PER_PROCESS.swaps.append(_Swap(feature, owner, name, _own(owner, name), new))
        setattr(owner, name, new)
    return before


def restore(feature: str) -> list[str]:
    """Put back what ``feature`` replaced, newest first; or, where another feature's value is
    on top of one of them, nothing, and the names so covered."""
    with _SWAPS_PER_PROCESS.lock:
        swaps = _SWAPS_PER_PROCESS.swaps
        mine = [s for s in swaps if s.feature == feature]
        covered = [f"{getattr(s.owner, '__name__', type(s.owner).__name__)}.{s.name}"
                   for s in mine if _own(s.owner, s.name) is not s.new]
        if covered:
            return covered
        for swap in reversed(mine):
            if swap.original is _ABSENT:
                delattr(swap.owner, swap.name)
            else:
                setattr(swap.owner, swap.name, swap.original)
            swaps.remove(swap)
    return []


def installed_features() -> list[str]:
    """The features with a replacement in force, in the order they were installed."""
    with _SWAPS_PER_PROCESS.lock:
        return list(dict.fromkeys(s.feature for s in _SWAPS_PER_PROCESS.swaps))

