"""``@auto_init_rpc``: the same entry point in a ``torchrun`` script and in a notebook.

- No RPC world yet (``torchrun``, or plain ``python`` for a world of one): join the world of
  ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, run ``worker_init_fn`` on every rank,
  call the function, then shut RPC down gracefully (rank 0 may use the others until it is done).
- A world is running (``%dist_start``): call through; ``worker_init_fn`` still runs once on
  every rank. A local world (one rank, or a loopback ``MASTER_ADDR``) listens on loopback only
  (TensorPipe and Gloo pinned to ``lo`` unless ``TP_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` are
  set; the store on ``MASTER_ADDR``); a multi-host world is left as torch sets it up.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlparse

from ..patches import no_rpc
from .partition import Partition
from .remote import remote_async_call
from .sync import barrier
from .whoami import (
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


_LOOPBACK_SCHEME = "nbdist-loopback"
_LOOPBACK_IFNAMES = {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def _loopback_only() -> Iterator[None]:
    """TensorPipe and Gloo on ``lo`` while a local world is joined; values set by the user win."""
    saved = {k: os.environ.get(k) for k in _LOOPBACK_IFNAMES}
    for k, v in _LOOPBACK_IFNAMES.items():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _loopback_rendezvous(url: str, timeout: timedelta | None = None, **kwargs: Any) -> Iterator:
    """``nbdist-loopback://HOST:PORT``: torch's TCP store, but rank 0 listens on HOST only.

    ``env://`` and ``tcp://`` make rank 0's store listen on every interface whatever
    ``MASTER_ADDR`` says; here rank 0 binds the socket itself and hands it to the store.
    """
    import torch.distributed as dist

    parsed = urlparse(url)
    query = dict(pair.split("=", 1) for pair in parsed.query.split("&") if pair)
    rank, world_size = int(query["rank"]), int(query["world_size"])
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 0
    timeout = timeout or timedelta(minutes=30)
    listen_fd = None
    if rank == 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(max(128, world_size))
        except OSError:
            sock.close()
            raise
        listen_fd = sock.detach()  # the store owns (and closes) it from here
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout, multi_tenant=True,
                          master_listen_fd=listen_fd)
    yield (store, rank, world_size)
    raise RuntimeError(f"{_LOOPBACK_SCHEME}:// rendezvous cannot re-rendezvous")


def _register_loopback_rendezvous() -> None:
    import importlib

    rdzv = importlib.import_module("torch.distributed.rendezvous")  # the attribute is a function
    try:
        rdzv.register_rendezvous_handler(_LOOPBACK_SCHEME, _loopback_rendezvous)
    except RuntimeError:  # registered by an earlier call in this process
        pass


def _local_backend_options(world_size: int) -> tuple[Any, str | None]:
    """Options for a local world, and a temp dir to remove after; (None, None) if not local."""
    import torch.distributed.rpc as rpc

    addr = os.environ.get("MASTER_ADDR")
    if world_size == 1 and addr is None:
        tmp = tempfile.mkdtemp(prefix="nbdist-rpc-")  # a world of one needs no network
        return rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmp}/rpc"), tmp
    if (addr is not None and _is_loopback(addr) and "MASTER_PORT" in os.environ
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"):
        _register_loopback_rendezvous()
        host = f"[{addr}]" if ":" in addr else addr
        url = f"{_LOOPBACK_SCHEME}://{host}:{int(os.environ['MASTER_PORT'])}"
        return rpc.TensorPipeRpcBackendOptions(init_method=url), None
    return None, None


def _world_is_local(world_size: int) -> bool:
    addr = os.environ.get("MASTER_ADDR")
    return (world_size == 1 and addr is None) or (addr is not None and _is_loopback(addr))


def _run_in_new_world(func: Callable[..., Any], args: tuple, kwargs: dict,
                      worker_init_fn: Callable[[], Any] | None, backend: Any,
                      rpc_backend_options: Any) -> Any:
    import torch.distributed.rpc as rpc

    from ..patches import quiet, thread_states, torch_private
    from ..shipping import pickler as shipping

    info = get_world_info()
    tmp = None
    if rpc_backend_options is None:
        rpc_backend_options, tmp = _local_backend_options(info.world_size)
    if info.world_rank == 0:  # a script has no %load_ext: say here what degrades on this torch
        for line in torch_private.report_once():
            print(line, file=sys.stderr, flush=True)
    shipping.install()
    thread_states.install()
    quiet.hide_warnings()
    try:
        with _loopback_only() if _world_is_local(info.world_size) else nullcontext():
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
            no_rpc.check(f"nbdist.parallel.auto_init_rpc ({func.__name__})")
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
