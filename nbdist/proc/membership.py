"""Joining and leaving a world: the steps rank 0 (``cluster.startup.Rank0``) and every worker
(``proc.worker``) take alike. Where the two differ, the caller says how, by parameter: rank 0
runs torch's blocking calls in a thread it watches (``run``), a worker calls them directly."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .. import world_state
from ..patches import process_group, rpc_hooks, rpc_rerun, thread_states
from ..shipping import pickler as shipping
from ..shm import transport as shm
from . import nccl

__all__ = ["Runner", "direct", "install_rpc_patches", "join_group", "join_rpc", "leave",
           "let_user_groups_in", "rpc_joined"]

#: Runs one blocking torch call; the string says what it waits for (in a timeout's message).
Runner = Callable[[Callable[[], Any], str], None]


def direct(fn: Callable[[], Any], what: str) -> None:
    """The ``Runner`` of a worker: call ``fn`` here (its own deadline is the notebook's)."""
    fn()


def install_rpc_patches(after_call: Callable[[], None] | None = None) -> None:
    """nbdist's changes to torch RPC in this process: functions shipped by value, thread
    states carried, RPC functions tracked (``after_call`` after each: a worker's flush)."""
    shipping.install()
    thread_states.install()
    rpc_hooks.install_callee(after_call=after_call)
    rpc_hooks.install_caller()


def join_rpc(name: str, rank: int, world_size: int, init_method: str, timeout: float,
             device_maps: dict | None, threads: int | None = None, run: Runner = direct) -> None:
    """``init_rpc`` as ``name``; ``threads``: TensorPipe's worker threads (None: torch's)."""
    import torch.distributed.rpc as rpc

    more = {} if threads is None else {"num_worker_threads": threads}
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=timeout,
                                           device_maps=device_maps or None, **more)
    init_rpc = getattr(rpc.init_rpc, "__nbdist_wrapped__", rpc.init_rpc)  # torch's own
    rpc_rerun.world_agent_joins()  # the agent about to be current is the world's
    run(lambda: init_rpc(name, rank=rank, world_size=world_size,
                         rpc_backend_options=opts), "join the RPC world (init_rpc)")


def rpc_joined(shm_config: dict | None) -> None:
    """After ``init_rpc``: torch RPC's functions known as patched, large tensors to this
    host's ranks through shared memory (``shm.transport.world_config``; None: not)."""
    shipping.register_patched("torch.distributed.rpc", "torch.distributed.rpc.api")
    shm.open_world(shm_config)


def join_group(backend: str, init_method: str, rank: int, world_size: int, timeout: float,
               device: str | None, run: Runner = direct, notebook: bool = False) -> None:
    """Join the world's default process group; ``notebook``: a timed-out NCCL collective
    raises rather than ending the process (``nccl.notebook_safe``)."""
    with nccl.notebook_safe(backend) if notebook else contextlib.nullcontext():
        run(lambda: process_group.torch_init(
            backend, init_method=init_method, rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout), device_id=nccl.device_id(backend, device)),
            "join the process group")


def let_user_groups_in(rank: int, world_size: int, name: str, store: Callable[[], Any],
                       timeout: float, backend: str | None, why: str) -> None:
    """User code's ``init_process_group`` here joins this world (``patches.process_group``):
    ``store`` makes the world's store for its groups; ``backend``: the default group this
    process joined (None: none), ``why`` what made it (``rank_config.world_group``)."""
    import torch.distributed as dist

    if not process_group.install():
        return
    process_group.attach(process_group.Membership(
        rank, world_size, name, store, timeout, backend, why),
        own_group=dist.group.WORLD if backend else None)


def leave(group: bool = True, rpc_agent: bool = True, reset_rpc: bool = True,
          interrupt: bool = False, reset_rrefs: bool = False) -> None:
    """Leave this process's world without waiting for any peer: ``interrupt`` RPC functions
    still running (they would hold up the shutdown), close shared memory, end user groups,
    end the default ``group``, shut the ``rpc_agent`` down, forget RPC's per-process state
    (``reset_rpc``) and the RRef context (``reset_rrefs``) for the next world; last, drop
    what described the world (``world_state.end``)."""
    import torch.distributed.rpc as rpc

    if interrupt:
        rpc_hooks.interrupt_rpc_threads()
    shm.close_world()
    process_group.detach()  # a group user code made and left is ended too
    if group:
        nccl.leave_group()
    if rpc_agent:
        try:
            rpc.shutdown(graceful=False)
        except Exception:  # noqa: BLE001 - not initialised, or its peers gone
            pass
    if reset_rpc:
        rpc_hooks.reset_world_state()
    if reset_rrefs:
        from ..patches import rref_reset

        rref_reset.reset_singleton()
    world_state.end()  # what described the world (shm, tracing, barriers...) goes with it
