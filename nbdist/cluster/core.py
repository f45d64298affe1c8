"""``Cluster``: one local RPC world with the notebook as rank 0; start, run, status, stop.

A facade over the parts in this package: ``startup`` (the start sequence and rank 0's own
membership), ``receiver`` (the thread that reads every worker), ``cells`` (running cells),
``status``, and ``session`` (state kept between worlds: the warm template, the runtime
directory). One cluster is active per notebook process.
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
from contextlib import AbstractContextManager
from typing import Any

from ..errors import ClusterStateError, DistTimeoutError, StartError, WorkerDiedError
from ..patches import rpc_hooks
from ..proc import netif
from ..proc.channel import Listener
from ..proc.hosts import HostAgent, launcher_argv, slurm_hosts, start_agents
from ..proc.protocol import Debug, Stop
from ..proc.runtime import pid_alive
from ..spec import WorldSpec, parse_hosts, parse_ranks
from ..telemetry import records, tracing
from .cells import Cells
from .followup import FollowUps
from .ranks import ClusterState, RankInfo
from .receiver import Receiver
from .router import Router
from .session import SESSION
from .startup import Rank0, StartWatch, worker_config
from .status import HostTable, StatusTable, collect_status, host_status

__all__ = ["Cluster", "current", "last_spec", "release_hosts", "restart", "start", "stop"]


def current() -> Cluster | None:
    """The active cluster of this notebook process, or None."""
    c = SESSION.current
    return c if c is not None and c.running else None


def last_spec() -> WorldSpec | None:
    """The settings of the most recently started world (for ``%dist_restart`` after a stop)."""
    return SESSION.last_spec


def start(n: int, *, name: str = "worker0", worker_name: str = "worker{rank}",
          threads: int | None = None, rpc_timeout: float = 60.0,
          process_group: str | None = None, start_timeout: float = 60.0,
          hosts: Any = None, iface: str | None = None, launcher: str = "ssh",
          remote_python: str | None = None, quiet: bool = False) -> Cluster:
    """Start ``n`` worker ranks and make this process rank 0 of their RPC world.

    ``hosts`` (``{"node1": 4, "node2": 4}``, ``"node1:4,node2:4"`` or ``"slurm"``) adds
    ranks on other machines after the ``n`` local ones, started there by ``launcher``
    (``ssh``, ``srun`` or a template with ``{host}`` and ``{command}``) running
    ``remote_python -m nbdist.join``; ``iface`` is this machine's interface or address that
    those hosts reach (required with ``hosts``). See the README, "More than one machine".
    """
    spec = WorldSpec(n, name, worker_name, threads, rpc_timeout, process_group,
                     start_timeout, hosts=parse_hosts(hosts, slurm_hosts), iface=iface,
                     launcher=launcher, remote_python=remote_python).validate()
    if current() is not None:
        raise ClusterStateError("a world is already running; use `%dist_restart` (or "
                                "`nbdist.current().restart()`) to start a new one, or "
                                "`%dist_stop` first")
    cluster = Cluster(spec)
    cluster._start(quiet=quiet)
    return cluster


def restart(n: int | None = None, *, quiet: bool = False, **changes: Any) -> Cluster:
    """Restart the running world or, after a stop, start the last one again (``%dist_restart``).

    Every setting not given keeps its value, ``hosts``, ``iface``, ``launcher`` and
    ``remote_python`` included (``hosts=()`` drops the hosts).
    """
    c = current()
    if c is not None:
        return c.restart(n, quiet=quiet, **changes)
    if SESSION.last_spec is None:
        raise ClusterStateError("no world to restart; start one with `%dist_start N`")
    cluster = Cluster(_changed(SESSION.last_spec, n, changes))
    cluster._start(quiet=quiet)
    return cluster


def _changed(spec: WorldSpec, n: int | None, changes: dict[str, Any]) -> WorldSpec:
    """``spec`` with the settings given changed (``None``: as it was), validated."""
    if changes.get("hosts") is not None:
        changes = {**changes, "hosts": parse_hosts(changes["hosts"], slurm_hosts) or ()}
    return spec.with_changes(n=n, **changes).validate()


def stop() -> None:
    """Stop the active cluster, if any."""
    if SESSION.current is not None:
        SESSION.current.stop()


def release_hosts() -> int:
    """End the join agents kept warm on other hosts (a running world that uses them is
    stopped first); returns how many there were. They also end with this process."""
    c = SESSION.current
    if c is not None and c.spec.hosts:
        c.stop()
    return SESSION.close_agents()


class Cluster:
    """A running local world. Use ``nbdist.start`` to make one."""

    def __init__(self, spec: WorldSpec) -> None:
        self.spec = spec
        self.names = spec.names()
        self._by_name = {nm: r for r, nm in enumerate(self.names)}
        self.state = ClusterState.NEW
        self.started_at = time.time()
        self.startup_seconds = 0.0
        self.epoch = next(SESSION.epochs)
        now = time.time()
        placement = spec.placement()
        self.ranks: dict[int, RankInfo] = {r: RankInfo(r, nm, started=now, host=placement[r])
                                           for r, nm in enumerate(self.names)}
        self.router = Router()
        self._cv = threading.Condition()
        self.cells = Cells(self.ranks, self._cv, self._require_running)
        self._receiver = Receiver(self.ranks, self.router, self.cells, self._cv)
        self._world_dir: str | None = None
        self._listener: Listener | None = None
        self._rank0: Rank0 | None = None
        self._agents: dict[str, HostAgent] = {}  # host -> its join agent
        self._store: Any = None  # a host world's rendezvous StoreServer
        self._followups = FollowUps(self.cells.interrupt_rpc)

    @property
    def running(self) -> bool:
        return self.state is ClusterState.RUNNING

    # ------------------------------------------------------------------ start
    def _start(self, quiet: bool) -> None:
        iface = None
        if self.spec.hosts:  # bad --iface or --launcher: ValueError before anything starts
            iface = netif.resolve(self.spec.iface)
            launcher_argv(self.spec.launcher, "host", [sys.executable])
        SESSION.last_spec = self.spec
        self.state.require(ClusterState.NEW, doing="start")
        self.state = ClusterState.STARTING
        t0 = time.monotonic()
        spec = self.spec
        watch = StartWatch(self.ranks, t0 + spec.start_timeout, spec.start_timeout, self._cv)
        template = SESSION.get_template()
        if spec.n:
            changed = template.env_changed()
            if changed:  # its torch was imported under the old values: workers must see these
                template.close()
                if not quiet:
                    print(f"nbdist: {', '.join(changed)} changed since the worker template "
                          "imported torch; starting a fresh template (one `import torch`)")
            template.ensure_started()  # imports torch in parallel with us
        import torch.distributed.rpc as rpc

        if not rpc.is_available():
            raise StartError("this torch build has no torch.distributed.rpc; install a build "
                             "with distributed support")
        try:
            self._world_dir = tempfile.mkdtemp(prefix="w", dir=SESSION.runtime())
            self.router.keep_logs_in(os.path.join(self._world_dir, "logs"))
            key = os.urandom(32)
            store_address = None
            if iface is not None:
                self._start_agents(iface, watch)
                self._listener = Listener((iface.address, 0), key)
                from ..proc.store import MemoryStore, StoreServer

                self._store = StoreServer(MemoryStore(spec.start_timeout), (iface.address, 0),
                                          key)
                store_address = self._store.address
            else:
                self._listener = Listener(os.path.join(self._world_dir, "ctl"), key)
            template.on_exit = self._on_exit
            configs = [worker_config(spec, self.names, r, self._world_dir, self._listener.path,
                                     key, self.epoch, store=store_address,
                                     ifname=iface.name if iface else "lo")
                       for r in range(1, spec.world_size)]
            self.ranks[0].pid = os.getpid()
            self.ranks[0].ready = True
            self._spawn_all(template, configs, watch)
            watch.accept_all(self._listener)
            self._listener.close()  # every rank is in: nothing listens for the rest of the world
            self._receiver.start()
            SESSION.current = self
            rpc_hooks.set_death_check(self._check_dest, self._interrupt_dest)
            rpc_hooks.set_after_reply(self._show_output_of)
            rpc_hooks.set_locator(self._remote_label)
            self._rank0 = Rank0(spec, self.names, self._world_dir, self.epoch,
                                store=self._store.store if self._store else None,
                                iface=iface)
            SESSION.settle_joiner(watch.deadline)
            self._rank0.join(watch)
            watch.wait_ready()
            watch.ping_all()
        except BaseException as exc:
            self._teardown()
            if isinstance(exc, (StartError, DistTimeoutError, KeyboardInterrupt)):
                raise
            raise StartError(f"could not start the world: {exc}") from exc
        self.state = ClusterState.RUNNING
        self.startup_seconds = time.monotonic() - t0
        records._set_identity(0, self.names[0])
        tracing.arm(0, self.names[0])
        tracing.set_peers(self._live_worker_names)
        if not quiet:
            print(f"nbdist: {spec.world_size} ranks ready in {self.startup_seconds:.2f}s: "
                  + ", ".join(f"{r}={nm}" for r, nm in enumerate(self.names)))

    def _start_agents(self, iface: netif.Interface, watch: StartWatch) -> None:
        """The join agent of every host is running (launched now if it is not)."""
        agents = SESSION.agents_for(self.spec, iface)
        for agent in agents:
            agent.on_exit = functools.partial(self._on_exit, host=agent.host)
            agent.on_lost = self._on_host_lost
            self._agents[agent.host] = agent
        start_agents(agents, SESSION.agent_key, watch.deadline)
        if not SESSION.warned_data_plane:
            SESSION.warned_data_plane = True
            Router.write("stderr", f"nbdist: this world's RPC and Gloo ports on {iface.name} "
                                   f"({iface.address}) and on the hosts accept unauthenticated "
                                   "connections (torch's TensorPipe and Gloo have no "
                                   "authentication): use a private network or a tunnel "
                                   "(README: More than one machine)\n")

    def _spawn_all(self, template: Any, configs: list[dict], watch: StartWatch) -> None:
        """Fork each rank where it lives: here through the template, elsewhere through its
        host's agent (all asked first, then all waited for)."""
        by_host: dict[str | None, list[dict]] = {}
        for cfg in configs:
            by_host.setdefault(cfg["host"], []).append(cfg)
        if None in by_host:
            template.wait_ready(watch.deadline)
        for host, cfgs in by_host.items():
            launcher = template if host is None else self._agents[host]
            for rank, pid in launcher.spawn(cfgs, watch.deadline).items():
                self.ranks[rank].pid = pid

    # ------------------------------------------------------------------ worker lives
    def _on_host_lost(self, host: str, why: str) -> None:
        """A host's agent went away or silent (its reader thread): its ranks are gone."""
        lost = []
        with self._cv:
            for info in self.ranks.values():
                if info.host == host and info.alive:
                    info.lost, info.exit_code = why, -signal.SIGKILL
                    lost.append(info.rank)
            self._cv.notify_all()
        if lost and self.running:
            Router.write("stderr", f"nbdist: host {host} lost ({why}): rank"
                                   f"{'s' if len(lost) > 1 else ''} "
                                   f"{', '.join(map(str, lost))} gone; `%dist_restart` "
                                   "relaunches it\n")

    def _on_exit(self, pid: int, code: int, host: str | None = None) -> None:
        """The template (or a host's agent) reaped a worker (called from its reader thread)."""
        for info in self.ranks.values():
            if info.pid == pid and info.rank != 0 and info.host == host:
                with self._cv:
                    info.exit_code = code
                    self._cv.notify_all()
                if self.running:
                    self.router.flush(info.rank)
                    Router.write("stderr", f"nbdist: {info.label()} {info.reason()}\n")
                return

    def _check_dest(self, dest: Any) -> None:
        """Called often while an RPC is waited for: serve worker debuggers; raise if ``dest``
        is a dead rank of this world."""
        self.cells.desk.serve()
        rank = self._rank_of(dest)
        if rank is not None:
            info = self.ranks[rank]
            if info.exit_code is not None:
                raise WorkerDiedError(rank, info.name, info.reason(), "an RPC waited on it")

    def _interrupt_dest(self, dest: Any, fut: Any = None) -> None:
        """Ctrl-C stopped the wait for ``fut`` on ``dest``: interrupt the RPC work running
        there too, and again while ``fut`` is not done (the call may not have started)."""
        rank = self._rank_of(dest)
        if rank:
            self.interrupt([rank])
            self._followups.add(rank, fut)

    def _show_output_of(self, dest: Any) -> None:
        """An RPC to ``dest`` returned: show what it printed before the caller goes on."""
        rank = self._rank_of(dest)
        if rank:
            self._receiver.caught_up(rank, timeout=0.5)

    def _remote_label(self, dest: Any) -> str | None:
        """``rank 3 (worker3) on node2`` for a rank on another host, else None."""
        rank = self._rank_of(dest)
        info = self.ranks.get(rank) if rank is not None else None
        return info.label() if info is not None and info.host else None

    def _rank_of(self, dest: Any) -> int | None:
        if isinstance(dest, int):
            return dest if dest in self.ranks else None
        return self._by_name.get(getattr(dest, "name", dest))

    def _live_worker_names(self) -> list[str]:
        return [i.name for r, i in self.ranks.items() if r and i.alive] if self.running else []

    # ------------------------------------------------------------------ cells
    def run(self, code: str, ranks: Any = None, timeout: float | None = None,
            show: bool = True, grid: bool = False) -> dict[int, str | None]:
        """Run ``code`` on worker ranks; returns rank -> repr of the last expression.

        Output streams into the current cell as it is printed; the last expression of each
        rank is printed as ``[name] value`` when ``show`` (a value with a rich repr shows as
        that). Displays and figures arrive as rich outputs labelled with the rank; ``grid``
        shows them at the end as one table, a column per rank. Raises ``DistCellError``
        naming every rank that failed, after the others' output was shown.
        """
        targets = parse_ranks(ranks, self.names)
        if not self.router.jupyter:  # in a notebook, each cell starts the limits over
            self.router.new_cell()
        with self.rich_cell(targets, grid=grid, results=show):
            exec_id = self.send_cell(code, targets)
            results = self.collect(exec_id, targets, timeout)
        return self.report(results, targets, show)

    def rich_cell(self, targets: list[int], grid: bool = False,
                  results: bool = True) -> AbstractContextManager[None]:
        """Around a cell on ``targets``: ``grid`` lays their rich outputs side by side at
        the end; ``results=False`` leaves rich last values unshown."""
        return self.cells.rich.cell(targets, grid=grid, results=results)

    def send_cell(self, code: str, targets: list[int]) -> int:
        """Hand a cell to the targets without waiting; returns the id ``collect`` takes."""
        return self.cells.send_cell(code, targets)

    def collect(self, exec_id: int, targets: list[int], timeout: float | None) -> dict:
        """Wait for a cell's results; interrupts and deaths are handled, never hangs."""
        return self.cells.collect(exec_id, targets, timeout)

    def report(self, results: dict, targets: list[int], show: bool = True) -> dict:
        """Show the values; raise ``DistCellError`` naming every rank that failed."""
        return self.cells.report(results, targets, show)

    def interrupt(self, ranks: Any = None) -> None:
        """Send KeyboardInterrupt to the cell and RPC functions running on workers."""
        targets = parse_ranks(ranks, self.names) if ranks is not None else list(
            range(1, self.spec.n + 1))
        self.cells.interrupt(targets)

    def debug(self, rank: Any = None) -> None:
        """A pdb session, in this notebook's input box, on a worker's last failure.

        ``rank`` (number or name) defaults to the rank whose error was shown last. Commands
        run on the worker in the frame where it failed (``p``, ``pp``, ``l``, ``ll``, ``w``,
        ``up``, ``down``, ``q``); ``breakpoint()`` on a worker opens the same prompt by itself.
        """
        if rank is None:
            rank = self.cells.last_failed or self._rpc_failed()
            if rank is None:
                raise ValueError("no worker error has been shown yet; name the rank: "
                                 "`%dist_debug 2` or `c.debug('worker2')`")
        (r,) = parse_ranks(rank, self.names)
        exec_id = next(SESSION.exec_ids)
        self._require_running("debug a rank")
        if not self.cells._send(r, Debug(exec_id)):
            raise WorkerDiedError(r, self.names[r], self.ranks[r].reason(), "asked to debug")
        self.report(self.collect(exec_id, [r], None), [r], show=False)

    def _rpc_failed(self) -> int | None:
        dest = rpc_hooks.last_failed_destination()
        return self._rank_of(dest) if dest is not None else None

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until everything workers printed or logged so far has reached the notebook.

        Output and metrics travel on the control channel while RPC results travel on
        TensorPipe, so right after an RPC returns its last lines may still be in flight;
        after ``flush()`` they have been shown and ``nbdist.history()`` has them.
        Returns False if some live worker did not answer in time.
        """
        if not self.running:
            return True
        ok = self.cells.flush(timeout)
        self.router.flush()
        return ok

    def logs(self, rank: Any, tail: int | None = 50) -> list[str]:
        """The last ``tail`` lines rank (number or name) printed; ``None``: all of them.

        Everything a rank prints is kept, shown or not: output outside any cell, and what
        a cell's output limit held back (a tail in memory, the whole log in a file of the
        world's runtime directory, removed at stop unless ``stop(keep_logs=DIR)``).
        """
        chosen = parse_ranks(rank, self.names)
        if len(chosen) != 1:
            raise ValueError(f"logs() takes one rank, not {rank!r}")
        r = chosen[0]
        self.router.flush(r)
        return self.router.logs(r, tail)

    # ------------------------------------------------------------------ status
    def status(self) -> StatusTable:
        """A table of every rank: pid, alive or how it died, CPU %, memory, uptime."""
        return collect_status(self, template_pid=SESSION.template_pid())

    def hosts_status(self) -> HostTable:
        """One row per host of this world: its agent's pid, ranks, load and free memory."""
        return host_status(self, self._agents)

    def worker_pids(self) -> list[int]:
        return [i.pid for r, i in self.ranks.items() if r != 0 and i.pid is not None]

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def _require_running(self, doing: str = "do that") -> None:
        self.state.require(ClusterState.RUNNING, doing=doing)

    # ------------------------------------------------------------------ stop / restart
    def stop(self, timeout: float = 5.0, keep_logs: str | None = None) -> None:
        """Stop every worker and leave RPC in this process ready for a new world.

        ``keep_logs``: a directory to copy each rank's full output log into first.
        """
        if self.state in (ClusterState.STOPPING, ClusterState.STOPPED):
            return
        if self.running and not self._receiver.is_current_thread():
            self.flush(timeout=min(timeout, 1.0))  # the last RPC's output is still shown
        try:
            if keep_logs is not None:
                self._copy_logs(keep_logs)
        finally:
            self._teardown(timeout)

    def _copy_logs(self, dest: str) -> None:
        os.makedirs(dest, exist_ok=True)
        self.router.flush()
        for path in self.router.log_paths().values():
            shutil.copy2(path, os.path.join(dest, os.path.basename(path)))

    def restart(self, n: int | None = None, *, quiet: bool = False, **changes: Any) -> Cluster:
        """Stop this world and start a new one; unspecified settings stay as they were
        (``hosts=()`` drops the hosts)."""
        spec = _changed(self.spec, n, changes)
        self.stop()
        cluster = Cluster(spec)
        cluster._start(quiet=quiet)
        return cluster

    def _teardown(self, timeout: float = 5.0) -> None:
        if self.state in (ClusterState.STOPPING, ClusterState.STOPPED):
            return
        self.state = ClusterState.STOPPING
        try:
            self.router.muted = True
            rpc_hooks.set_death_check(None)
            rpc_hooks.set_after_reply(None)
            rpc_hooks.set_locator(None)
            tracing.set_peers(None)
            self._followups.stop()
            if self._rank0 is not None:  # first, so rank 0's agent does not complain
                self._rank0.leave()
                if self._rank0.joiner is not None:
                    SESSION.joiner = self._rank0.joiner
            self._stop_workers(timeout)
            for info in self.ranks.values():
                chan, info.channel = info.channel, None
                if chan is not None:
                    chan.close(timeout=0.5)
            self._receiver.stop()
            self.router.close()
            if self._listener is not None:
                self._listener.close()
            if self._store is not None:
                self._store.close()
            if self._world_dir is not None:
                shutil.rmtree(self._world_dir, ignore_errors=True)
        finally:
            self.state = ClusterState.STOPPED
            if SESSION.current is self:
                SESSION.current = None

    def _stop_workers(self, timeout: float) -> None:
        """Ask each worker to stop; SIGKILL (through its template or agent) at half the
        timeout."""
        workers = [i for r, i in self.ranks.items() if r and i.alive]
        for info in workers:
            if info.channel is not None:
                try:
                    info.channel.send(Stop())
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        killed = False
        with self._cv:
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
                self._cv.wait(0.02)

    def _launcher_of(self, info: RankInfo) -> Any:
        """The template or agent that forked ``info``'s process (None if it is gone)."""
        return SESSION.template if info.host is None else self._agents.get(info.host)

    def _pids_by_launcher(self, workers: list[RankInfo]) -> dict[Any, list[int]]:
        found: dict[Any, list[int]] = {}
        for info in workers:
            launcher = self._launcher_of(info)
            if info.alive and info.pid and launcher is not None and launcher.alive():
                found.setdefault(launcher, []).append(info.pid)
        return found

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<nbdist.Cluster {self.state.value}: " + ", ".join(
            f"{r}={nm}" for r, nm in enumerate(self.names)) + ">"
