"""Joining and leaving a world: one sequence, ``join(config, steps)``, for rank 0
(``cluster.startup.Rank0``) and every worker (``proc.worker``), each with the ``RankConfig``
``cluster.startup.worker_config`` made for it. Where the two differ, ``steps`` says how:
``Steps`` is a worker's way (torch's calls made directly, the notebook's store reached over
its own connection); rank 0's way overrides it (each blocking call in a thread it watches,
the rendezvous opened by itself, the workers waited for)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .. import world_state
from ..patches import process_group, rpc_hooks, rpc_rerun, thread_states
from ..rank_config import RankConfig
from ..shipping import pickler as shipping
from ..shm import transport as shm
from . import nccl
from .lazy_gloo import lazy_connections

__all__ = ["Runner", "Steps", "install_rpc_patches", "join", "join_group", "join_rpc",
           "leave", "let_user_groups_in", "rpc_joined"]

#: Runs one blocking torch call; the string says what it waits for (in a timeout's message).
Runner = Callable[[Callable[[], Any], str], None]


class Steps:
    """How a process takes ``join``'s steps where rank 0 and a worker differ: a worker's way.
    ``after_call`` runs after each RPC function this process serves (a worker's flush)."""

    notebook = False  # rank 0: a timed-out NCCL collective raises rather than ending the process

    def __init__(self, cfg: RankConfig, after_call: Callable[[], None] | None = None) -> None:
        self.cfg = cfg
        self.after_call = after_call

    def run(self, fn: Callable[[], Any], what: str) -> None:
        """Make one of torch's blocking calls (a ``Runner``): here, directly (a worker's own
        deadline is the notebook's)."""
        fn()

    def world_store(self) -> Any:
        """The world's store in a world with hosts (None: files); a worker's is a connection
        of its own to the notebook's store."""
        cfg = self.cfg
        if not cfg.store:
            return None
        from . import store

        return store.RemoteStore(cfg.store, cfg.authkey, cfg.start_timeout)

    def user_group_store(self) -> Callable[[], Any]:
        """What makes the store of the groups user code makes (``patches.process_group``)."""
        cfg = self.cfg
        if cfg.store:
            return self.world_store
        import torch.distributed as dist

        path = cfg.user_groups
        return lambda: dist.FileStore(path, -1)

    def without_rpc(self) -> None:
        """A world without RPC: RPC calls here raise ``NoRpcError`` saying so."""
        import torch.distributed.rpc as rpc

        from ..patches import no_rpc

        no_rpc.enter(no_rpc.FLAG if rpc.is_available() else no_rpc.BUILD)

    def arrive(self, arrivals: Any) -> None:
        """A world without RPC: say this rank is about to join the group (rank 0 waits for
        every worker's word before it joins: Gloo's rendezvous would wait its whole timeout)."""
        arrivals.set(self.cfg.arrived.format(rank=self.cfg.rank), "1")

    def before_rpc(self) -> None:
        """What comes before ``init_rpc``'s patches (rank 0: the resets of an earlier world)."""

    def rpc_options(self) -> tuple[str, float, int | None]:
        """``init_rpc``'s init method, timeout and TensorPipe worker threads (None: torch's)."""
        return self.cfg.rpc_init, self.cfg.rpc_timeout, self.cfg.rpc_threads

    def torch_calls(self) -> contextlib.AbstractContextManager[Any]:
        """What torch's joining calls run inside (rank 0: its interface, a bounded Gloo)."""
        return contextlib.nullcontext()

    def after_rpc(self) -> None:
        """Just after ``init_rpc``: RRef ids unlike any of an earlier world."""
        from ..patches import rref_reset

        rref_reset.start_ids_at(self.cfg.epoch)

    def after_group(self) -> None:
        """Just after the default process group was joined."""


def join(cfg: RankConfig, steps: Steps) -> None:
    """Join the world ``cfg`` describes as its rank: the RPC world (with nbdist's patches of
    torch RPC) or, without RPC, only the default process group (a bare world: none); then
    user code's ``init_process_group`` here joins this world too."""
    from . import store

    if not cfg.rpc:
        steps.without_rpc()
        hosted = steps.world_store()
        if hosted is not None:
            store.use(hosted)
        if cfg.process_group:
            if hosted is not None:
                arrivals = hosted
            else:
                import torch.distributed as dist

                arrivals = dist.FileStore(cfg.arrivals, cfg.world_size)
            steps.arrive(arrivals)
            with steps.torch_calls():
                _join_default_group(cfg, steps)
        _let_user_groups_in(cfg, steps)
        return
    steps.before_rpc()
    install_rpc_patches(after_call=steps.after_call)
    from ..telemetry import tracing

    tracing.install(cfg.rank, cfg.name)
    hosted = steps.world_store()
    if hosted is not None:  # a world with hosts: the rendezvous goes through the notebook's store
        store.use(hosted)
    init_method, timeout, threads = steps.rpc_options()
    with steps.torch_calls():
        join_rpc(cfg.name, cfg.rank, cfg.world_size, init_method, timeout, cfg.device_maps,
                 threads=threads, run=steps.run, transports=cfg.tp_transports,
                 lazy_gloo=hosted is None)
        steps.after_rpc()
        rpc_joined(cfg.shm)
        if cfg.process_group:
            _join_default_group(cfg, steps)
    _let_user_groups_in(cfg, steps)


def _join_default_group(cfg: RankConfig, steps: Steps) -> None:
    assert cfg.process_group is not None
    join_group(cfg.process_group, cfg.pg_init, cfg.rank, cfg.world_size, cfg.pg_timeout,
               cfg.device, run=steps.run, notebook=steps.notebook)
    steps.after_group()


def _let_user_groups_in(cfg: RankConfig, steps: Steps) -> None:
    let_user_groups_in(cfg.rank, cfg.world_size, cfg.name, steps.user_group_store(),
                       cfg.pg_timeout, cfg.process_group, cfg.group_why)


def install_rpc_patches(after_call: Callable[[], None] | None = None) -> None:
    """nbdist's changes to torch RPC in this process: functions shipped by value, thread
    states carried, RPC functions tracked (``after_call`` after each: a worker's flush)."""
    shipping.install()
    thread_states.install()
    rpc_hooks.install_callee(after_call=after_call)
    rpc_hooks.install_caller()


def join_rpc(name: str, rank: int, world_size: int, init_method: str, timeout: float,
             device_maps: dict | None, threads: int | None, run: Runner,
             transports: list[str] | None = None, lazy_gloo: bool = False) -> None:
    """``init_rpc`` as ``name``; ``threads``: TensorPipe's worker threads, ``transports``
    its transports (None: torch's own; ``spec.WorldSpec.tp_transports``); ``lazy_gloo``:
    its Gloo group connects only the pairs it uses (``lazy_gloo``; every rank of a world
    must agree: a world on one machine, whose rendezvous is files)."""
    import torch.distributed.rpc as rpc

    more: dict[str, Any] = {} if threads is None else {"num_worker_threads": threads}
    if transports is not None:
        more["_transports"] = transports
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init_method, rpc_timeout=timeout,
                                           device_maps=device_maps or None, **more)
    init_rpc = getattr(rpc.init_rpc, "__nbdist_wrapped__", rpc.init_rpc)  # torch's own
    rpc_rerun.world_agent_joins()  # the agent about to be current is the world's
    def joining() -> None:
        try:
            init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
        except BaseException as exc:
            # a failed init_rpc's frames hold its Gloo group (sockets, an epoll loop, a
            # thread); the error, kept for the user to read, must not keep them open
            traceback.clear_frames(exc.__traceback__)
            raise

    with lazy_connections() if lazy_gloo else contextlib.nullcontext():
        run(joining, "join the RPC world (init_rpc)")


def rpc_joined(shm_config: dict | None) -> None:
    """After ``init_rpc``: torch RPC's functions known as patched, large tensors to this
    host's ranks through shared memory (``shm.transport.world_config``; None: not)."""
    shipping.register_patched("torch.distributed.rpc", "torch.distributed.rpc.api")
    shm.open_world(shm_config)


def join_group(backend: str, init_method: str, rank: int, world_size: int, timeout: float,
               device: str | None, run: Runner, notebook: bool = False) -> None:
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
    still running (they would hold up the shutdown); the world's state ends
    (``world_state.end``: shared memory, the groups user code made, tracing, barriers...);
    then torch's own: end the default ``group``, shut the ``rpc_agent`` down, forget RPC's
    per-process state (``reset_rpc``) and the RRef context (``reset_rrefs``)."""
    import torch.distributed.rpc as rpc

    def torch_own() -> None:
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

    if interrupt:
        rpc_hooks.interrupt_rpc_threads()
    world_state.end(then=torch_own)
