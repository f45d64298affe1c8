"""``@auto_init_rpc``: the same entry point in a ``torchrun`` script and in a notebook.

- No RPC world yet (a script under ``torchrun``, or plain ``python`` for a world of one): join
  the world described by ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, run
  ``worker_init_fn`` on every rank, wait for all, call the function, then shut RPC down
  (gracefully, so rank 0 can still use the others until it is done).
- A world is already running (``%dist_start`` did it): just call through. ``worker_init_fn``
  still runs once on every rank: called on the notebook, it runs there and on each worker.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

from .partition import Partition
from .remote import remote_async_call
from .sync import barrier
from .world import (
    default_worker_name_format,
    get_world_info,
    get_world_rank,
    get_world_size,
    rpc_live,
    set_worker_name_format,
)

__all__ = ["auto_init_rpc"]

F = TypeVar("F", bound=Callable[..., Any])


class _OtherRanks:
    """Partitioner: one argument-less call on every rank but this one."""

    def __call__(self) -> list[Partition]:
        me = get_world_rank()
        return [Partition(r, (), {}) for r in range(get_world_size()) if r != me]


def _init_everywhere(worker_init_fn: Callable[[], Any]) -> None:
    """In a running world: ``worker_init_fn`` on every rank (from the notebook) or here."""
    from ..cluster import core as cluster

    if cluster.current() is None or get_world_size() == 1:
        worker_init_fn()
        return
    fut = remote_async_call(worker_init_fn, partitioner=_OtherRanks())
    worker_init_fn()
    fut.wait()


def _run_in_new_world(func: Callable[..., Any], args: tuple, kwargs: dict,
                      worker_init_fn: Callable[[], Any] | None, backend: Any,
                      rpc_backend_options: Any) -> Any:
    import torch.distributed.rpc as rpc

    from ..patches import rpc_hooks, shipping

    info = get_world_info()
    tmp = None
    if rpc_backend_options is None and info.world_size == 1 and "MASTER_ADDR" not in os.environ:
        tmp = tempfile.mkdtemp(prefix="nbdist-rpc-")  # a world of one needs no network
        rpc_backend_options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmp}/rpc")
    shipping.install()
    rpc_hooks.quiet_warnings()
    try:
        rpc.init_rpc(info.worker_name, backend=backend, rank=info.world_rank,
                     world_size=info.world_size, rpc_backend_options=rpc_backend_options)
        ok = False
        try:
            if worker_init_fn is not None:
                barrier()
                worker_init_fn()
            barrier()
            result = func(*args, **kwargs)
            ok = True
            return result
        finally:
            rpc.shutdown(graceful=ok)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def auto_init_rpc(worker_init_fn: Callable[[], Any] | None = None,
                  worker_name_format: Callable[..., str] | str = default_worker_name_format,
                  *, backend: Any = None, rpc_backend_options: Any = None) -> Callable[[F], F]:
    """Decorator for a program's entry function: join (or reuse) the RPC world around it.

    ``worker_name_format(world_rank=, world_size=, local_rank=, local_world_size=)`` names the
    ranks of a world this decorator starts (default ``worker{rank}``); a str pattern such as
    ``"trainer{rank}"`` works too. In a running world the ranks keep their names.
    """
    set_worker_name_format(worker_name_format)

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if rpc_live():
                if worker_init_fn is not None:
                    _init_everywhere(worker_init_fn)
                return func(*args, **kwargs)
            run = _run_in_new_world
            try:
                from torch.distributed.elastic.multiprocessing.errors import record

                run = record(_run_in_new_world)  # torchrun's error file, when it asks for one
            except ImportError:  # pragma: no cover
                pass
            return run(func, args, kwargs, worker_init_fn, backend, rpc_backend_options)

        return wrapped  # type: ignore[return-value]

    return decorate
