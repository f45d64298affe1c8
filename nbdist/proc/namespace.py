"""What a view (``c[:]``) runs on a worker: names set and read in its ``__main__``, and a
function applied to each item of a chunk.

These functions are importable on every rank, so RPC sends them by reference; the values and
the user's function travel as arguments. The namespace is the one ``%%dist`` cells run
against (``mirror.main_namespace``). A name set here is the rank's own binding: a notebook
global of the same name mirrored later does not overwrite it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..shipping.own_main import main_namespace

__all__ = ["apply_each", "assign", "read"]


def assign(values: dict[str, Any]) -> None:
    """Bind each name of ``values`` in this rank's ``__main__``."""
    main_namespace().update(values)


def read(names: str | tuple[str, ...]) -> Any:
    """The value of ``names`` (one name) or a tuple of values (several) in ``__main__``;
    a missing name raises ``NameError`` naming it, as the cell would."""
    ns = main_namespace()
    wanted = (names,) if isinstance(names, str) else names
    missing = [n for n in wanted if n not in ns]
    if missing:
        raise NameError(f"name {missing[0]!r} is not defined in this rank's __main__ "
                        "(push it, or define it in a %%dist cell)")
    if isinstance(names, str):
        return ns[names]
    return tuple(ns[n] for n in names)


def apply_each(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """``[fn(x) for x in items]``: one rank's share of ``View.map``."""
    return [fn(x) for x in items]
