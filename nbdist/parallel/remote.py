"""``remote_async_call`` / ``remote_sync_call``: map a function over partitions, then reduce.

The function runs inside ``RemoteCall`` on each rank: an exception there comes back as a
``RemoteFailure`` (type, message, traceback, rank and worker name) instead of a bare string,
and the caller raises one ``PartitionError`` naming every rank that failed. Functions defined
in notebook cells travel by value (nbdist's RPC pickler), so they need not be importable.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ..patches import no_rpc
from .failures import PartitionError, PartitionFailure
from .partition import Partition, Partitioner, batch_partitioner
from .reduce import PartitionResults
from .whoami import get_worker_id, get_world_info, worker_names

__all__ = ["RemoteCall", "RemoteFailure", "UNSET_RPC_TIMEOUT", "remote_async_call",
           "remote_sync_call"]

try:  # torch.distributed.rpc's "use the agent's default timeout"
    from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT
except ImportError:  # pragma: no cover - torch without RPC
    UNSET_RPC_TIMEOUT = -1.0


@dataclass
class RemoteFailure:
    """What a partition raised on its rank, in a form that always travels back."""

    rank: int
    name: str
    etype: str
    message: str
    traceback: str
    original: bytes | None = None  # the pickled exception, when it pickles

    def exception(self) -> BaseException | None:
        """The original exception, if it survived the trip."""
        if self.original is None:
            return None
        try:
            exc = pickle.loads(self.original)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


class RemoteCall:
    """Run ``func`` on a rank; return its result, or a ``RemoteFailure`` if it raised."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.func(*args, **kwargs)
        except Exception as exc:
            try:
                info = get_world_info()
                rank, name = info.world_rank, info.worker_name
            except Exception:
                rank, name = -1, "?"
            try:  # by value, so exception classes defined in a notebook cell survive too
                original = cloudpickle.dumps(exc)
            except Exception:
                original = None
            tb = exc.__traceback__
            if tb is not None and tb.tb_frame.f_code is RemoteCall.__call__.__code__:
                tb = tb.tb_next
            text = "".join(traceback.format_exception(type(exc), exc, tb))
            return RemoteFailure(rank, name, _type_name(type(exc)), str(exc), text, original)


def _type_name(cls: type) -> str:
    mod = cls.__module__
    return cls.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{cls.__qualname__}"


def _func_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _partitions(args: tuple, kwargs: dict, partitioner: Partitioner | None) -> list[Partition]:
    if partitioner is None:
        partitioner = batch_partitioner
    if isinstance(partitioner, (int, str)) and not isinstance(partitioner, bool):
        return [Partition(get_worker_id(partitioner), args, kwargs)]
    if not callable(partitioner):
        raise TypeError(f"partitioner must be a rank (int), a worker name (str) or a function "
                        f"returning (rank, args, kwargs) triples, got {partitioner!r}")
    raw = partitioner(*args, **kwargs)
    out = []
    for i, part in enumerate(raw):
        try:
            rank, part_args, part_kwargs = part
        except (TypeError, ValueError):
            raise TypeError(f"partition {i} from {partitioner!r} is {part!r}; a partitioner "
                            "must return (rank, args, kwargs) triples") from None
        out.append(Partition(get_worker_id(rank), tuple(part_args or ()),
                             dict(part_kwargs or {}), getattr(part, "size", None)))
    if not out:
        raise ValueError(f"partitioner {partitioner!r} returned no partitions")
    return out


class _Launched:
    """The futures of one partitioned call, and how to turn them into a result or an error."""

    def __init__(self, func: Callable[..., Any], parts: list[Partition], timeout: float) -> None:
        import torch.distributed.rpc as rpc

        self.func_name = _func_name(func)
        self.parts = parts
        self.names = worker_names()
        # async_execution functions must reach the agent as themselves (it checks a marker).
        call = func if getattr(func, "_wrapped_async_rpc_function", None) else RemoteCall(func)
        self.futures = [rpc.rpc_async(p.rank, call, args=p.args, kwargs=p.kwargs,
                                      timeout=timeout) for p in parts]

    def outcome(self) -> tuple[PartitionResults | None, PartitionError | None]:
        """Results of finished futures, or the error naming every failed partition."""
        results, failures, causes = [], [], []
        n = len(self.parts)
        for i, (part, fut) in enumerate(zip(self.parts, self.futures, strict=True)):
            name = self.names[part.rank] if part.rank < len(self.names) else f"rank{part.rank}"
            try:
                value = fut.wait()
            except Exception as exc:  # the call never ran or its reply never came back
                msg = str(exc)
                if msg.startswith("On WorkerInfo("):
                    msg = msg.split("\n", 1)[-1]
                failures.append(PartitionFailure(part.rank, name, _type_name(type(exc)),
                                                 msg.strip(), msg, i, n))
                causes.append(exc)
                continue
            if isinstance(value, RemoteFailure):
                failures.append(PartitionFailure(part.rank, name, value.etype, value.message,
                                                 value.traceback, i, n))
                causes.append(value.exception())
                continue
            results.append(value)
        if failures:
            err = PartitionError(self.func_name, failures)
            err.__cause__ = next((c for c in causes if c is not None), None)
            return None, err
        return PartitionResults(results, [p.size for p in self.parts],
                                [p.rank for p in self.parts]), None


def _launch(func: Callable[..., Any], args: Sequence[Any] | None, kwargs: dict | None,
            partitioner: Partitioner | None, timeout: float | None) -> _Launched:
    if not callable(func):
        raise TypeError(f"func must be callable, got {func!r}")
    no_rpc.check(f"nbdist.parallel's remote call of {_func_name(func)}")
    args = tuple(args) if args is not None else ()
    kwargs = dict(kwargs) if kwargs is not None else {}
    parts = _partitions(args, kwargs, partitioner)
    return _Launched(func, parts, UNSET_RPC_TIMEOUT if timeout is None else timeout)


def remote_async_call(func: Callable[..., Any], *, args: Sequence[Any] | None = None,
                      kwargs: dict | None = None, partitioner: Partitioner | None = None,
                      reducer: Callable[[Iterable[Any]], Any] | None = None,
                      timeout: float | None = UNSET_RPC_TIMEOUT) -> Any:
    """Run ``func`` on the partitions' ranks without waiting; returns a ``torch.futures.Future``.

    ``partitioner``: a rank, a worker name, or a function returning ``(rank, args, kwargs)``
    triples (default ``batch_partitioner``). The future's value is ``reducer(results)``, or the
    list of results in partition order when there is no reducer. If any partition raised, the
    future raises ``PartitionError`` naming the ranks, workers and original errors.
    """
    import torch

    launched = _launch(func, args, kwargs, partitioner, timeout)
    out: torch.futures.Future = torch.futures.Future()

    def finish(_: Any) -> None:
        try:
            results, error = launched.outcome()
            if error is not None:
                out.set_exception(error)
                return
            out.set_result(reducer(results) if reducer is not None else results)
        except BaseException as exc:  # noqa: BLE001 - a callback must not lose the error
            out.set_exception(exc)

    torch.futures.collect_all(launched.futures).add_done_callback(finish)
    return out


def remote_sync_call(func: Callable[..., Any], *, args: Sequence[Any] | None = None,
                     kwargs: dict | None = None, partitioner: Partitioner | None = None,
                     reducer: Callable[[Iterable[Any]], Any] | None = None,
                     timeout: float | None = UNSET_RPC_TIMEOUT) -> Any:
    """Run ``func`` on the partitions' ranks and return ``reducer(results)`` (or the list).

    Same arguments as ``remote_async_call``. The wait can be interrupted (Ctrl-C) and gives up
    at once when a rank it waits on dies; the reducer runs in the calling thread.
    """
    from ..errors import WorkerDiedError
    from ..patches.rpc_hooks import wait_future

    launched = _launch(func, args, kwargs, partitioner, timeout)
    for part, fut in zip(launched.parts, launched.futures, strict=True):
        try:
            wait_future(fut, part.rank)
        except WorkerDiedError:
            raise
        except Exception:
            pass  # recorded with its rank by ``outcome`` below
    results, error = launched.outcome()
    if error is not None:
        raise error
    return reducer(results) if reducer is not None else results
