"""One world's processes from start to teardown: the part of a ``Cluster`` that is not facade.

``World.start`` runs the start sequence (join agents, rendezvous store, control listener,
forks, rank 0's ``init_rpc``, readiness) and attaches the world to rank 0's RPC calls
(``rpc_hooks.attach``); ``World.teardown`` undoes all of it, escalating from a ``Stop``
message to SIGKILL through each rank's launcher. Between the two it hears of workers'
deaths and of lost hosts. It shares the ranks, their condition, the router, the cells and the
receiver with the ``Cluster`` that made it.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .. import devices, open_files
from ..control.channel import Listener
from ..control.protocol import Rejoin, Stop
from ..envflag import switched_on
from ..errors import DistTimeoutError, StartError, WorkerDiedError
from ..groups import graveyard, torchrun_env
from ..hosts import allocation, netif
from ..hosts.host_agents import HostAgent, launcher_argv, start_agents
from ..hosts.launch import Launcher
from ..output.receiver import Receiver
from ..output.router import Router
from ..patches import no_rpc, rpc_hooks
from ..proc import cuda, nccl
from ..proc.runtime import pid_alive
from ..rank_config import RankConfig, world_group
from ..rank_info import RankInfo
from ..rank_sets import SMALL, numbers, rank_set, spans
from ..spec import WorldSpec
from ..telemetry import records, tracing
from .cells import Cells
from .followup import FollowUps
from .lifecycle import ClusterState
from .session import session
from .shield import held_interrupts
from .startup import Cancelled, Rank0, StartWatch, worker_config

__all__ = ["World"]


class World:
    """A world's processes and connections; satisfies ``rpc_hooks.WorldHooks`` while running.

    ``on_up`` is called once every worker is connected, before rank 0 joins the RPC world
    (from then on the world is the process's current one); ``on_down`` when it has stopped;
    ``on_death(rank)`` when a worker of the running world exits.
    """

    def __init__(self, spec: WorldSpec, names: list[str], ranks: dict[int, RankInfo],
                 cv: threading.Condition, router: Router, cells: Cells, receiver: Receiver,
                 epoch: int, on_up: Callable[[], None], on_down: Callable[[], None],
                 on_death: Callable[[int], None] | None = None) -> None:
        self.spec, self.names, self.ranks, self.cv = spec, names, ranks, cv
        self.router, self.cells, self.receiver, self.epoch = router, cells, receiver, epoch
        self._on_up, self._on_down, self._on_death = on_up, on_down, on_death
        self._by_name = {nm: r for r, nm in enumerate(names)}
        self._state = ClusterState.NEW  # changed by _move only
        self.startup_seconds = 0.0
        self.iface: netif.Interface | None = None
        self.master: dict[str, str] = {}  # MASTER_ADDR/MASTER_PORT of this world's ranks
        self.world_dir: str | None = None
        self.listener: Listener | None = None
        self.rank0: Rank0 | None = None
        self.agents: dict[str, HostAgent] = {}  # host -> its join agent
        self.store: Any = None  # a host world's rendezvous StoreServer
        self.followups = FollowUps(cells.interrupt_rpc)
        cells.agent_of = self._relay_of
        self.key = os.urandom(32)  # authenticates control connections and the store
        self.gpu: devices.Setup | None = None  # set by check()
        self.why_no_rpc = ""  # no_rpc.FLAG or BUILD in a world without RPC
        self._told_end = False  # the end of the world's allocation was reported

    @property
    def state(self) -> ClusterState:
        """Where this world is in its life (``lifecycle.MOVES``)."""
        return self._state

    def _move(self, new: ClusterState) -> None:
        """Go to state ``new``; ``ClusterStateError`` if ``MOVES`` has no such move."""
        self._state = self._state.moved_to(new)

    @property
    def running(self) -> bool:
        return self.state is ClusterState.RUNNING

    # ------------------------------------------------------------------ start
    def check(self) -> None:
        """Bad ``--iface``, ``--launcher``, ``--gpus``, ``--process-group`` or
        ``--device-maps``, or too few open files allowed for the world's size: ValueError
        before anything starts (but the warm template, launched first so that its ``import
        torch`` runs beside this process's, which planning needs)."""
        open_files.ensure(self.spec.world_size, self.spec.rpc
                          and self.spec.tp_transports() is None)
        if self.spec.n:
            session().get_template().ensure_started()
        if self.spec.hosts:
            self.iface = netif.resolve(self.spec.iface)
            if self.spec.scheduled != "ray":  # Ray starts the agents itself, as actors
                launcher_argv(self.spec.launcher, "host", [sys.executable])
        self.gpu = self._plan_devices(self.spec, self.names)
        for r, info in self.ranks.items():
            info.device = self.gpu.device(r)

    @staticmethod
    def _plan_devices(spec: WorldSpec, names: list[str]) -> devices.Setup:
        """Each local rank's device, the group's backend and device maps (ValueError if the
        flags cannot be met here)."""
        has_cuda, count = cuda.visible()
        remote = allocation.remote_devices(spec, session().allocation)
        return devices.setup(spec.gpus, spec.group_backend, spec.device_maps, names,
                             spec.n + 1, count, has_cuda, remote)

    def start(self, quiet: bool, since: float | None = None) -> None:
        """Start every rank and join them as rank 0; on any failure, tear down and raise.
        ``since`` (``time.monotonic()``): when the user asked, for the start line's time."""
        self.state.require(ClusterState.NEW, doing="start")
        self._move(ClusterState.STARTING)
        t0 = time.monotonic()
        spec = self.spec
        watch = StartWatch(self.ranks, t0 + spec.start_seconds(), spec.start_seconds(), self.cv)
        template = self._warm_template(quiet, keeping=False)
        self.why_no_rpc = self._choose_rpc()
        try:
            self.world_dir = tempfile.mkdtemp(prefix="w", dir=session().runtime())
            self.router.keep_logs_in(os.path.join(self.world_dir, "logs"))
            if self.iface is not None:
                self._start_agents(self.iface, watch)
            self.ranks[0].pid = os.getpid()
            self.ranks[0].ready = True
            self._join_all(template, watch, kept=set())
        except BaseException as exc:
            self.teardown()
            if isinstance(exc, (StartError, DistTimeoutError, KeyboardInterrupt)):
                raise
            raise StartError(f"could not start the world: {exc}") from exc
        self._running(t0 if since is None else since)
        if not quiet:
            note = f" ({self.gpu.note})" if self.gpu is not None and self.gpu.note else ""
            print(f"nbdist: {spec.world_size} ranks ready in {self.startup_seconds:.2f}s: "
                  + _names(self.names) + note
                  + _without_rpc(self.why_no_rpc, self.spec.group_backend)
                  + _merge_note(spec))

    def rebuild(self, spec: WorldSpec, names: list[str], epoch: int, kept: set[int],
                since: float | None = None, phase: ClusterState = ClusterState.RESTARTING,
                cancelled: Callable[[], str] | None = None) -> None:
        """Keep-restart: the same world directory, receiver and cells; ranks in ``kept`` keep
        their process (and ``__main__``) and rejoin a new RPC world of ``spec``; every other
        worker rank is forked fresh under its number, ranks beyond the new size are stopped.
        On failure everything is torn down, as a failed start is; flags the machine cannot
        meet (``--gpus``, nccl) raise ValueError first, with the world untouched. ``since``:
        as ``start``'s. ``phase``: the state while it runs (healing, restarting, growing);
        ``cancelled`` (says why, or "") calls it off at its next wait (``Cancelled``)."""
        self.state.require(ClusterState.RUNNING, doing="restart keeping state")
        gpu = self._plan_devices(spec, names)
        self._move(phase)
        t0 = time.monotonic()
        try:
            self._leave_rpc()
            gone = [i for r, i in self.ranks.items() if r and (r not in kept)]
            self._stop_workers(5.0, gone)
            self._close_channels(gone)
            with self.cv:
                for info in gone:
                    del self.ranks[info.rank]
                self.spec, self.names, self.epoch, self.gpu = spec, names, epoch, gpu
                self._by_name = {nm: r for r, nm in enumerate(names)}
                placement, now = spec.placement(), time.time()
                for r in range(1, spec.world_size):
                    if r in kept:
                        self.ranks[r].name, self.ranks[r].ready = names[r], False
                    else:
                        self.ranks[r] = RankInfo(r, names[r], started=now, host=placement[r])
                    self.ranks[r].device = gpu.device(r)
                self.ranks[0].name = names[0]
            self.receiver.poke()
            watch = StartWatch(self.ranks, t0 + spec.start_seconds(), spec.start_seconds(), self.cv,
                               cancelled)
            if cancelled is not None and cancelled():
                raise Cancelled(cancelled())
            template = self._warm_template(quiet=True, keeping=True)
            self.why_no_rpc = self._choose_rpc()
            if self.store is not None:
                self.store.close()
                self.store = None
            if self.iface is not None:  # a lost host's agent starts again (Ray: its bundle
                self._start_agents(self.iface, watch)  # placed anew, maybe on another node)
            self._join_all(template, watch, kept=kept)
        except BaseException as exc:
            self.teardown()
            if isinstance(exc, (KeyboardInterrupt, Cancelled)):
                raise
            raise StartError(f"could not rebuild the world, so every rank was stopped "
                             f"(`%dist_restart` starts a fresh one): {exc}") from exc
        self._running(t0 if since is None else since)

    def _warm_template(self, quiet: bool, keeping: bool) -> Launcher:
        """The session's template, started if it is not; a fresh one if the environment
        torch was imported under changed (not while it is the parent of kept ranks)."""
        template = session().get_template()
        if self.spec.n:
            changed = template.env_changed()
            if changed and not keeping:  # its torch was imported under the old values
                template.close()
                if not quiet:
                    print(f"nbdist: {', '.join(changed)} changed since the worker template "
                          "imported torch; starting a fresh template (one `import torch`)")
            template.ensure_started()  # imports torch in parallel with us
        return template

    def _join_all(self, template: Launcher, watch: StartWatch, kept: set[int]) -> None:
        """Fork the ranks not ``kept``, tell the kept ones to rejoin, and join as rank 0;
        returns once every rank answered an RPC."""
        spec, iface = self.spec, self.iface
        store_address = None
        if iface is not None:
            self.listener = Listener((iface.address, 0), self.key)
            from ..proc.store import MemoryStore, StoreServer

            self.store = StoreServer(MemoryStore(spec.start_seconds()), (iface.address, 0),
                                     self.key)
            store_address = self.store.address
        else:
            assert self.world_dir is not None
            self.listener = Listener(os.path.join(self.world_dir, f"ctl-{self.epoch}"),
                                     self.key)
        template.on_exit = self.on_exit
        shares = allocation.rank_shares(spec, session().allocation)
        group = world_group(spec, self.gpu)  # the default group, the same for every rank
        self.master = torchrun_env.master(iface.address if iface else "127.0.0.1")
        rank0_cfg, *configs = [  # rank 0's from the same builder as every worker's
            worker_config(spec, self.names, r, self.world_dir, self.listener.path, self.key,
                          self.epoch, group, store=store_address,
                          ifname=iface.name if iface else "lo", gpu=self.gpu,
                          share=shares.get(r), master=self.master)
            for r in range(spec.world_size)]
        for cfg in configs:
            if cfg.rank in kept:
                info = self.ranks[cfg.rank]
                if info.channel is None or not info.alive:
                    raise WorkerDiedError(info.rank, info.name, info.reason(),
                                          "asked to rejoin")
                info.channel.send(Rejoin(cfg))
        self._agents_starting(True)
        self._spawn_all(template, [c for c in configs if c.rank not in kept], watch)
        watch.accept_all(self.listener, {r for r in self.ranks if r and r not in kept})
        self.listener.close()  # every rank is in: nothing listens for the rest of the world
        if not self.receiver.started:
            self.receiver.start()
        self.receiver.poke()
        self._on_up()
        rpc_hooks.attach(self)
        self.rank0 = Rank0(rank0_cfg, store=self.store.store if self.store else None,
                           iface=iface)
        session().settle_joiner(watch.deadline)
        if not spec.rpc:
            no_rpc.enter(self.why_no_rpc)
        self.rank0.join(watch)
        watch.wait_ready("join the process group" if not spec.rpc else "join the RPC world")
        if spec.rpc:
            watch.ping_all()

    def _agents_starting(self, starting: bool) -> None:
        """While ranks join, an agent starved of CPU for a few seconds is not a lost host."""
        for agent in self.agents.values():
            agent.starting = starting

    def _running(self, since: float) -> None:
        self._agents_starting(False)
        self._move(ClusterState.RUNNING)
        self.startup_seconds = time.monotonic() - since
        torchrun_env.enter({**torchrun_env.variables(0, self.spec.placement()), **self.master})
        records.set_identity(0, self.names[0])
        if self.spec.rpc:
            tracing.arm(0, self.names[0])
            tracing.set_peers(self.live_worker_names)

    def _choose_rpc(self) -> str:
        """A world asked for with RPC starts without it where torch has none (the start line
        says so); returns why the world has no RPC (``no_rpc.FLAG`` or ``BUILD``)."""
        import torch.distributed as dist
        import torch.distributed.rpc as rpc

        if not dist.is_available():
            raise StartError("this torch build has no torch.distributed; install a build "
                             "with distributed support")
        if self.spec.rpc and not rpc.is_available():
            self.spec = replace(self.spec, rpc=False)
            self.gpu = self._plan_devices(self.spec, self.names)  # the group is now gloo's
            return no_rpc.BUILD
        return no_rpc.FLAG if not self.spec.rpc else ""

    def _start_agents(self, iface: netif.Interface, watch: StartWatch) -> None:
        """The join agent of every host is running (launched now if it is not)."""
        agents = session().agents_for(self.spec, iface)
        for agent in agents:
            agent.on_exit = functools.partial(self.on_exit, host=agent.host)
            agent.on_lost = self.on_host_lost
            agent.on_relayed = self.receiver.relayed
            self.agents[agent.host] = agent
        try:
            start_agents(agents, session().agent_key, watch.deadline)
        except (StartError, DistTimeoutError) as exc:
            if not self.spec.scheduled:
                raise
            raise type(exc)(f"{exc}\n(--{self.spec.scheduled}: the agents connect back to "
                            f"{iface.address} on {iface.name}; where the nodes cannot reach "
                            "that address, give --iface with this machine's interface or "
                            "address they reach)"
                            ) from None
        if not session().warned_data_plane:
            session().warned_data_plane = True
            Router.write("stderr", f"nbdist: this world's RPC and Gloo ports on {iface.name} "
                                   f"({iface.address}) and on the hosts accept unauthenticated "
                                   "connections (torch's TensorPipe and Gloo have no "
                                   "authentication): use a private network or a tunnel "
                                   "(docs/guide/machines.md)\n")

    def _spawn_all(self, template: Launcher, configs: list[RankConfig],
                   watch: StartWatch) -> None:
        """Fork each rank where it lives: here through the template, elsewhere through its
        host's agent (all asked first, then all waited for)."""
        by_host: dict[str | None, list[RankConfig]] = {}
        for cfg in configs:
            by_host.setdefault(cfg.host, []).append(cfg)
        if None in by_host:
            template.wait_ready(watch.deadline)
        with held_interrupts():  # a Ctrl-C here would leave a fork with no known pid
            for host, cfgs in by_host.items():
                launcher: Launcher = template if host is None else self.agents[host]
                for rank, pid in launcher.spawn(cfgs, watch.deadline).items():
                    self.ranks[rank].pid = pid

    # ------------------------------------------------------------------ worker lives
    def on_host_lost(self, host: str, why: str) -> None:
        """A host's agent went away or silent (its reader thread): its ranks are gone, named
        with the scheduler's reason where it has one (Ray: the node's death), and each told
        as a death (``--heal`` replaces them). When the world's allocation ended, every rank
        on it is lost, in one line in SLURM's words (asked once the job has finished
        completing, a few seconds at most)."""
        scheduled, job = self.running and self.spec.scheduled, session().allocation
        why = (allocation.lost_why(self.spec, host, job) if scheduled else None) or why
        lost = self._lose({host}, why)
        ended = allocation.ended(self.spec, job) if scheduled else None
        if ended is not None:
            hosts = sorted({h for h, _ in self.spec.hosts})
            lost = self._lose(set(hosts), ended, relabel=True)
            if lost and self.running and not self._told_end:
                self._told_end = True
                Router.write("stderr", f"nbdist: {ended}: {_ranks(lost)} on {', '.join(hosts)} "
                                       "lost; `%dist_restart` asks for a new allocation with "
                                       "the same options\n")
        elif lost and self.running:
            again = "--heal starts it again" if self.spec.heal else \
                "`%dist_restart` relaunches it"
            Router.write("stderr", f"nbdist: host {host} lost ({why}): {_ranks(lost)} gone; "
                                   f"{again}\n")
            for rank in lost if self._on_death is not None else ():
                self._on_death(rank)

    def _lose(self, hosts: set[str], why: str, relabel: bool = False) -> list[int]:
        """Mark the live ranks on ``hosts`` lost for ``why`` (``relabel``: also those lost
        before, whose reason ``why`` replaces); returns them."""
        lost = []
        with self.cv:
            for info in self.ranks.values():
                if info.host in hosts and (info.alive or (relabel and info.lost)):
                    info.lost, info.exit_code = why, -signal.SIGKILL
                    lost.append(info.rank)
            self.cv.notify_all()
        for rank in lost:
            self.cells.calls.died(rank)  # a relayed view call waits no longer
        return lost

    def on_exit(self, pid: int, code: int, host: str | None = None) -> None:
        """The template (or a host's agent) reaped a worker (called from its reader thread)."""
        for info in self.ranks.values():
            if info.pid == pid and info.rank != 0 and info.host == host:
                with self.cv:
                    info.exit_code = code
                    self.cv.notify_all()
                self.cells.calls.died(info.rank)
                if self.running:
                    self.router.flush(info.rank)
                    Router.write("stderr", f"nbdist: {info.label()} {info.reason()}\n")
                    if self._on_death is not None:
                        self._on_death(info.rank)
                    if self.rank0 is not None and self.rank0.cfg.process_group == "nccl":
                        nccl.end_group(timeout=0)  # rank 0's collectives fail, not wait
                return

    # ------------------------------------------------------------------ rpc_hooks.WorldHooks
    def check_dest(self, dest: Any) -> None:
        """Called often while an RPC is waited for: serve worker debuggers; raise if ``dest``
        is a dead rank of this world."""
        self.cells.desk.serve()
        rank = self.rank_of(dest)
        if rank is not None:
            info = self.ranks[rank]
            if info.exit_code is not None:
                raise WorkerDiedError(rank, info.name, info.reason(), "an RPC waited on it")

    def interrupted(self, dest: Any, fut: Any = None) -> None:
        """Ctrl-C stopped the wait for ``fut`` on ``dest``: interrupt the RPC work running
        there too, and again while ``fut`` is not done (the call may not have started)."""
        rank = self.rank_of(dest)
        if rank:
            self.cells.interrupt([rank])
            self.followups.add(rank, fut)

    def interrupted_all(self, futures: dict[int, Any]) -> None:
        """Ctrl-C stopped the wait for these ranks' calls: ``interrupted`` for each, the
        interrupts sent at once (one frame per host)."""
        self.cells.interrupt(list(futures))
        for rank, fut in futures.items():
            self.followups.add(rank, fut)

    def replied(self, dest: Any) -> None:
        """An RPC to ``dest`` returned: show what it printed before the caller goes on."""
        rank = self.rank_of(dest)
        if rank:
            self.receiver.caught_up(rank, timeout=0.5)
            self.router.release([rank])  # lines held for merging, too

    def locate(self, dest: Any) -> str | None:
        """``rank 3 (worker3) on node2`` for a rank on another host, else None."""
        rank = self.rank_of(dest)
        info = self.ranks.get(rank) if rank is not None else None
        return info.label() if info is not None and info.host else None

    def rank_of(self, dest: Any) -> int | None:
        """The rank ``dest`` (a rank, name or WorkerInfo) names in this world, or None."""
        if isinstance(dest, int):
            return dest if dest in self.ranks else None
        return self._by_name.get(getattr(dest, "name", dest))

    def live_worker_names(self) -> list[str]:
        return [i.name for r, i in self.ranks.items() if r and i.alive] if self.running else []

    # ------------------------------------------------------------------ teardown
    def teardown(self, timeout: float = 5.0) -> None:
        """Stop every worker, leave rank 0's RPC ready for a new world, free what was made."""
        if self.state in (ClusterState.STOPPING, ClusterState.STOPPED):
            return
        self._agents_starting(False)
        with held_interrupts():  # half a teardown would leave workers running
            self._teardown(timeout)

    def _teardown(self, timeout: float) -> None:
        self._move(ClusterState.STOPPING)
        try:
            self.router.muted = True
            self._leave_rpc()
            self._stop_workers(timeout, [i for r, i in self.ranks.items() if r])
            graveyard.release(everything=True)  # no peer is left to keep a collective waiting
            self._close_channels(list(self.ranks.values()))
            self.receiver.stop()
            self.router.close()
            if self.listener is not None:
                self.listener.close()
            if self.store is not None:
                self.store.close()
            if self.world_dir is not None:
                shutil.rmtree(self.world_dir, ignore_errors=True)
        finally:
            torchrun_env.leave()
            self._move(ClusterState.STOPPED)
            self._on_down()

    @staticmethod
    def _close_channels(infos: list[RankInfo]) -> None:
        """Close these ranks' control channels (their workers were asked to stop)."""
        for info in infos:
            chan, info.channel = info.channel, None
            if chan is not None:
                chan.close(timeout=0.5)

    def _leave_rpc(self) -> None:
        """Rank 0 leaves the RPC world (first, so its agent does not complain of the others)."""
        rpc_hooks.detach()
        no_rpc.leave()
        tracing.set_peers(None)
        self.followups.stop()
        self.followups = FollowUps(self.cells.interrupt_rpc)
        if self.rank0 is not None:
            self.rank0.leave()
            if self.rank0.joiner is not None:
                session().joiner = self.rank0.joiner

    def _stop_workers(self, timeout: float, among: list[RankInfo]) -> None:
        """Ask each worker of ``among`` to stop; SIGKILL (through its template or agent) at
        half the timeout."""
        workers = [i for i in among if i.alive]
        self.cells.send_all([i.rank for i in workers], Stop())
        deadline = time.monotonic() + timeout
        killed = False
        with self.cv:
            while any(i.alive for i in workers):
                now = time.monotonic()
                for info in workers:
                    launcher = self._launcher_of(info)
                    if info.alive and (launcher is None or not launcher.alive()):
                        # no one will report its exit: its launcher's death killed it
                        # (PR_SET_PDEATHSIG here; an agent kills its ranks when it ends)
                        if info.host is not None or not pid_alive(info.pid):  # type: ignore
                            info.exit_code = -signal.SIGKILL
                if not killed and now > deadline - timeout / 2:
                    killed = True
                    for launcher, pids in self._pids_by_launcher(workers).items():
                        launcher.kill(pids, signal.SIGKILL)
                if now > deadline:
                    break
                self.cv.wait(0.02)

    def _relay_of(self, info: RankInfo) -> HostAgent | None:
        """The agent that relays to ``info``'s rank (``hosts.rank_pipes``), or None: a local
        rank, a lost host, or ``NBDIST_RELAY=0`` (each remote rank sent to directly)."""
        if info.host is None or not switched_on("NBDIST_RELAY"):
            return None
        agent = self.agents.get(info.host)
        return agent if agent is not None and agent.alive() else None

    def _launcher_of(self, info: RankInfo) -> Launcher | None:
        """The template or agent that forked ``info``'s process (None if it is gone)."""
        return session().template if info.host is None else self.agents.get(info.host)

    def _pids_by_launcher(self, workers: list[RankInfo]) -> dict[Launcher, list[int]]:
        found: dict[Launcher, list[int]] = {}
        for info in workers:
            launcher = self._launcher_of(info)
            if info.alive and info.pid and launcher is not None and launcher.alive():
                found.setdefault(launcher, []).append(info.pid)
        return found


def _merge_note(spec: WorldSpec) -> str:
    """The start line's word on merged output, when it is on without being asked for."""
    if spec.aggregate == "auto" and spec.aggregates():
        return ("; a line several ranks print at once shows once, led by their names "
                "(`--aggregate off`: once per rank)")
    return ""


def _names(names: list[str]) -> str:
    """The start line's ranks: ``0=agent, 1=worker1, ...``; past ``SMALL`` workers written
    compactly (``ranks 0-255: agent,worker1-255``)."""
    if len(names) - 1 <= SMALL:
        return ", ".join(f"{r}={nm}" for r, nm in enumerate(names))
    return f"ranks {spans(range(len(names)))}: {rank_set(names)}"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {numbers(ranks)}"


def _without_rpc(why: str, backend: str | None) -> str:
    """The start line's note on a world without RPC (empty for a world with it)."""
    if not why:
        return ""
    cause = "--no-rpc" if why == no_rpc.FLAG else "this torch has no torch.distributed.rpc"
    return f"; no RPC ({cause}), " + (f"process group {backend}" if backend else "no process group")
