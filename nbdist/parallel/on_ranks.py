"""Run a function only on some ranks: ``@rank_zero_only``, ``@on_rank(1, 2)`` and friends.

The rank is looked up when the function is called, not when it is decorated, so a decorator
applied in a notebook cell before ``%dist_start`` (or shipped to a worker) still sees the
right rank. A skipped call returns None.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from .whoami import get_worker_id, get_world_rank

__all__ = ["not_on_rank", "on_rank", "rank_all", "rank_non_zero_only", "rank_zero_only"]

F = TypeVar("F", bound=Callable[..., Any])


def _gate(ranks: tuple[int | str, ...], inverse: bool) -> Callable[[F], F]:
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, (int, str)):
            raise TypeError(f"ranks are ints (or worker names), got {r!r}")

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            me = get_world_rank()
            chosen = me in {r if isinstance(r, int) else get_worker_id(r) for r in ranks}
            if chosen != inverse:
                return func(*args, **kwargs)
            return None

        return wrapped  # type: ignore[return-value]

    return decorate


def on_rank(*ranks: int | str) -> Callable[[F], F]:
    """Decorator: run the function only on these ranks (or worker names); elsewhere None."""
    return _gate(ranks, inverse=False)


def not_on_rank(*ranks: int | str) -> Callable[[F], F]:
    """Decorator: run the function on every rank except these; on them return None."""
    return _gate(ranks, inverse=True)


def rank_all(func: F) -> F:
    """Decorator that changes nothing: the function runs on every rank."""
    return func


def rank_zero_only(func: F) -> F:
    """Decorator: run only on rank 0 (the notebook, in an nbdist world)."""
    return on_rank(0)(func)


def rank_non_zero_only(func: F) -> F:
    """Decorator: run only on ranks other than 0 (the workers, in an nbdist world)."""
    return not_on_rank(0)(func)
