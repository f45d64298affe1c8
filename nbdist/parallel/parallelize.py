"""``@parallelize``: a function that, when called, runs partitioned on the world's ranks.

The decorated name now means "call remotely"; the original function is what travels to the
ranks (by value when it lives in a notebook cell), so no module-level alias is needed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from .partition import Partitioner, batch_partitioner
from .reduce import mean_reducer
from .remote import UNSET_RPC_TIMEOUT, remote_async_call, remote_sync_call

__all__ = ["parallelize", "parallelize_async", "parallelize_sync"]

Reducer = Callable[[Iterable[Any]], Any]


def _defaults(partitioner: Partitioner | None,
              reducer: Reducer | None) -> tuple[Partitioner, Reducer | None]:
    """No partitioner means data parallel: ``batch_partitioner`` and, unless given, the mean."""
    if partitioner is None:
        return batch_partitioner, (mean_reducer if reducer is None else reducer)
    return partitioner, reducer


def parallelize_async(partitioner: Partitioner | None = None, reducer: Reducer | None = None,
                      timeout: float | None = UNSET_RPC_TIMEOUT
                      ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: calling the function returns a future of ``remote_async_call`` on it."""
    part, red = _defaults(partitioner, reducer)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return remote_async_call(func, args=args, kwargs=kwargs, partitioner=part,
                                     reducer=red, timeout=timeout)

        wrapped.__wrapped__ = func  # type: ignore[attr-defined]
        return wrapped

    return decorate


def parallelize(partitioner: Partitioner | None = None, reducer: Reducer | None = None,
                timeout: float | None = UNSET_RPC_TIMEOUT
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: calling the function runs ``remote_sync_call`` on it and returns the result.

    ``@parallelize(partitioner=batch_partitioner, reducer=mean_reducer)`` is data parallelism;
    with no arguments at all, that is the default.
    """
    part, red = _defaults(partitioner, reducer)

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return remote_sync_call(func, args=args, kwargs=kwargs, partitioner=part,
                                    reducer=red, timeout=timeout)

        wrapped.__wrapped__ = func  # type: ignore[attr-defined]
        return wrapped

    return decorate


parallelize_sync = parallelize
