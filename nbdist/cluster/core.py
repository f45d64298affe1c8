"""``Cluster``: one local RPC world with the notebook as rank 0; start, run, status, stop.

The facade: ``world`` (start-up, worker lives, teardown), ``cells`` (running cells),
``receiver`` (the thread that reads every worker), ``status``; ``session`` keeps what outlives
worlds (the warm template, the runtime directory, join agents). One world is current per
notebook process; this module keeps it, and stops it when the process exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from ..control.protocol import Debug
from ..errors import ClusterStateError, DistTimeoutError, StartError, WorkerDiedError
from ..hosts import allocation
from ..hosts.scheduler import enclosing_hosts
from ..output.receiver import Receiver
from ..output.router import Router
from ..patches import rpc_hooks
from ..rank_info import RankInfo
from ..rank_sets import SMALL, grouped, numbers, spans
from ..spec import WorldSpec, parse_hosts, parse_ranks
from ..telemetry import events
from .cells import Cells
from .frames import SentFrames
from .heal import Healer
from .lifecycle import ClusterState
from .session import session
from .startup import Cancelled
from .status import HostTable, StatusTable, collect_status, host_status, remote_samples
from .views import Load, View, select
from .world import World

__all__ = ["Cluster", "current", "last_spec", "latest", "release_hosts", "restart", "start",
           "stop"]


def current() -> Cluster | None:
    """The active cluster of this notebook process, or None: running, or rebuilt in place
    (healing, restarting or growing with ``--keep``: its ranks run, a cell waits for it)."""
    c = session().latest
    return c if c is not None and c.state.live else None


def latest() -> Cluster | None:
    """The world started last in this process: running, stopping, stopped or failed."""
    return session().latest


def last_spec() -> WorldSpec | None:
    """The settings of the most recently started world (for ``%dist_restart`` after a stop)."""
    return session().last_spec


def start(n: int, *, name: str = "worker0", worker_name: str = "worker{rank}",
          threads: int | None = None, rpc_timeout: float = 60.0,
          process_group: str | None = None, start_timeout: float | None = None,
          hosts: Any = None, iface: str | None = None, launcher: str = "ssh",
          remote_python: str | None = None, gpus: str = "auto",
          device_maps: str | None = None, heal: bool = False, rpc: bool = True,
          aggregate: bool | str = "auto", slurm: str | None = None,
          tabs: bool = False, quiet: bool = False, ray: str | None = None,
          rpc_transport: str = "auto") -> Cluster:
    """Start ``n`` worker ranks and make this process rank 0 of their RPC world.

    ``rpc=False`` (``--no-rpc``): no torch RPC agent on any rank, a process group instead
    (``process_group``, default gloo); so too, with a note, where torch has no RPC.

    ``hosts`` (``{"node1": 4, "node2": 4}``, ``"node1:4,node2:4"`` or ``"slurm"``) adds
    ranks on other machines after the ``n`` local ones, started there by ``launcher``
    (``ssh``, ``srun`` or a template with ``{host}`` and ``{command}``) running
    ``remote_python -m nbdist.join``; ``iface`` is this machine's interface or address that
    those hosts reach (required with ``hosts``). See docs/guide/machines.md.
    ``gpus`` (``"auto"``, ``"none"``, ``"0,2"``), ``process_group`` (``"gloo"``, ``"nccl"``,
    ``"auto"``) and ``device_maps`` (``"auto"``): docs/guide/gpus.md.
    ``heal``: a worker that dies is replaced on its own, the others keeping their state
    (``Cluster.restart(keep=True)``); see docs/guide/when-a-rank-dies.md.
    ``aggregate``: a line printed by several ranks at once shows once, led by the ranks
    (``[worker1-12] ...``); "auto" turns it on from 8 workers (docs/guide/output.md).
    ``slurm`` (``"-N 2 --ntasks-per-node=4 -t 1:00:00"``): sbatch options of one SLURM
    allocation whose nodes are the hosts, ``--ntasks-per-node`` ranks on each, kept across
    restarts until ``release_hosts()`` (docs/guide/machines.md).
    ``ray`` (``"--nodes 2 --ranks-per-node 2 --cpus 2"``): a placement group on the Ray
    cluster this process sees, one bundle per node, its bundles the hosts, kept across
    restarts until ``release_hosts()`` (docs/guide/machines.md, "Nodes from Ray").
    ``tabs``: ``%%dist`` cells show a live tab per rank (docs/guide/output.md).
    ``rpc_transport`` (``"auto"``, ``"shm"``, ``"tcp"``): how torch RPC's TensorPipe carries
    messages between this machine's ranks; "auto" is shared memory up to 16 ranks and TCP on
    loopback above (docs/guide/big-worlds.md).
    The start line's "ready in" counts from this call.
    """
    since = time.monotonic()
    if (slurm or ray) and hosts:
        flag = "--slurm" if slurm else "--ray"
        raise ValueError(f"{flag} and --hosts both say where ranks run: give one ({flag} asks "
                         f"{'SLURM' if slurm else 'Ray'} for the nodes, --hosts names them)")
    spec = WorldSpec(n, name, worker_name, threads, rpc_timeout, process_group,
                     start_timeout, hosts=parse_hosts(hosts, enclosing_hosts), iface=iface,
                     launcher=launcher, remote_python=remote_python, gpus=gpus,
                     device_maps=device_maps, heal=heal, rpc=rpc,
                     aggregate=aggregate, slurm=slurm, tabs=tabs, ray=ray,
                     rpc_transport=rpc_transport).validate()
    _refuse_a_second_world()
    return _start_new(spec, quiet, since=since)


def _start_new(spec: WorldSpec, quiet: bool, handle: Cluster | None = None,
               since: float | None = None) -> Cluster:
    """A world of ``spec`` on its scheduler's allocation, if any, in a new ``Cluster`` or in
    ``handle`` (a full restart: the object a user holds stays the current world's handle); a
    failed start gives back an allocation it asked for itself (one kept from before stays).
    ``since`` (``time.monotonic()``): when the user asked (default now)."""
    since = time.monotonic() if since is None else since
    before = session().allocation
    try:
        spec = allocation.provide(spec, session(), quiet)
        if handle is None:
            cluster = Cluster(spec)
        else:
            cluster = handle
            cluster._build(spec)
        cluster._start(quiet=quiet, since=since)
    except BaseException:
        if session().allocation is not None and session().allocation is not before:
            session().close_agents()
        raise
    return cluster


def restart(n: int | None = None, *, keep: bool = False, quiet: bool = False,
            **changes: Any) -> Cluster:
    """Restart the running world or, after a stop, start the last one again (``%dist_restart``).

    Every setting not given keeps its value, ``hosts``, ``iface``, ``launcher`` and
    ``remote_python`` included (``hosts=()`` drops the hosts). ``keep``: live workers keep
    their process and state (``Cluster.restart``).
    """
    since = time.monotonic()
    c = current()
    if c is not None:
        return c.restart(n, keep=keep, quiet=quiet, **changes)
    if session().last_spec is None:
        raise ClusterStateError("no world to restart; start one with `%dist_start N`")
    if keep and not quiet:
        print("nbdist: no world is running, so no rank has state to keep; starting a fresh one")
    if _drops_scheduler(changes):
        session().close_agents()
    return _start_new(_changed(session().last_spec, n, changes), quiet, since=since)


def _drops_scheduler(changes: dict[str, Any]) -> bool:
    """Whether ``--slurm none`` or ``--ray none`` is among a restart's ``changes``: the
    allocation kept warm is given back (and its agents end) before the new world starts."""
    return any(_is_none(changes.get(k)) for k in ("slurm", "ray"))


def _is_none(value: Any) -> bool:
    """``--slurm none`` / ``--ray none`` (or empty): back to no scheduler."""
    return isinstance(value, str) and value.strip().lower() in ("", "none")


def _refuse_a_second_world(handle: Cluster | None = None) -> None:
    """A world other than ``handle``'s runs in this process: starting another would only
    meet torch's "RPC is already initialized", so say what to do instead."""
    c = current()
    if c is not None and c is not handle:
        raise ClusterStateError("a world is already running in this process "
                                "(`nbdist.current()`); use `%dist_restart` (or "
                                "`nbdist.current().restart()`) to start a new one, or "
                                "`%dist_stop` first")


def _changed(spec: WorldSpec, n: int | None, changes: dict[str, Any]) -> WorldSpec:
    """``spec`` with the settings given changed (``None``: as it was), validated."""
    slurm, ray = changes.pop("slurm", None), changes.pop("ray", None)
    if changes.get("hosts") is not None:
        changes = {**changes, "hosts": parse_hosts(changes["hosts"], enclosing_hosts) or ()}
        spec = replace(spec, slurm=None, ray=None)  # named hosts (or none) replace these
    for flag, given in (("slurm", slurm), ("ray", ray)):
        if given is not None:  # new options: a new allocation ("none": back to no hosts)
            spec = replace(spec, slurm=None, ray=None, hosts=())
            spec = replace(spec, **{flag: None if _is_none(given) else given})
    return spec.with_changes(n=n, **changes).validate()


def stop() -> None:
    """Stop the active cluster, if any."""
    if session().latest is not None:
        session().latest.stop()


def release_hosts() -> int:
    """End the join agents kept warm on other hosts (a running world that uses them is
    stopped first); returns how many there were. They also end with this process."""
    c = session().latest
    if c is not None and c.spec.hosts:
        c.stop()
    return session().close_agents()


class Cluster:
    """A running local world. Use ``nbdist.start`` to make one."""

    def __init__(self, spec: WorldSpec) -> None:
        self._build(spec)

    def _build(self, spec: WorldSpec) -> None:
        """Fresh parts for a world of ``spec`` (at creation, and at each full restart: the
        handle a user holds stays the handle of the current world)."""
        self.spec = spec
        self.names = spec.names()
        self.started_at = time.time()
        self.epoch = next(session().epochs)
        now = time.time()
        placement = spec.placement()
        self.ranks: dict[int, RankInfo] = {r: RankInfo(r, nm, started=now, host=placement[r])
                                           for r, nm in enumerate(self.names)}
        self.router = Router(workers=lambda: [r for r, i in list(self.ranks.items())
                                              if r and i.alive])
        self.router.aggregate = spec.aggregates()
        cv = threading.Condition()
        self.cells = Cells(self.ranks, cv, self._require_running, session().exec_ids)
        self._receiver = Receiver(self.ranks, self.router, self.cells.rich, self.cells.desk,
                                  self.cells.comms, cv, on_result=self.cells.deliver,
                                  on_flushed=self.cells.flushed,
                                  on_returned=self.cells.calls.returned)
        self._world = World(spec, self.names, self.ranks, cv, self.router, self.cells,
                            self._receiver, self.epoch, on_up=self._became_current,
                            on_down=self._stopped, on_death=self._died)
        # The one owner of the world's moves: a start, stop, keep-restart or heal holds it
        # for its whole length; ``_stop_asked`` (why, under ``_guard``) calls a rebuild
        # under way off at its next wait, so a stop never waits a heal out.
        self._lifecycle = threading.RLock()
        self._guard = threading.Lock()
        self._stop_asked = ""
        self._settled = threading.Event()  # clear while --heal rebuilds the world
        self._settled.set()
        self.healer: Healer | None = None
        self._load = Load()  # view calls in flight per rank, for View.choose

    @property
    def state(self) -> ClusterState:
        return self._world.state

    @property
    def running(self) -> bool:
        return self._world.running

    @property
    def rpc(self) -> bool:
        """Whether this world has torch RPC (False: ``--no-rpc``, or a torch without it;
        ``spec.rpc`` is what was asked for)."""
        return self._world.spec.rpc

    @property
    def tabs(self) -> bool:
        """Whether ``%%dist`` cells show a live tab per rank (``%dist_start --tabs``); set it
        to change the world's setting (restarts keep it)."""
        return self.spec.tabs

    @tabs.setter
    def tabs(self, on: bool) -> None:
        self.spec = replace(self.spec, tabs=bool(on))
        if session().last_spec is not None:
            session().last_spec = replace(session().last_spec, tabs=bool(on))

    @property
    def startup_seconds(self) -> float:
        return self._world.startup_seconds

    @property
    def frames(self) -> SentFrames:
        """Control frames this world's cells, interrupts, flushes and stops sent (a host's
        ranks take one frame, through its join agent): ``frames.last_cell.frames``."""
        return self.cells.frames

    def _start(self, quiet: bool, since: float) -> None:
        _refuse_a_second_world(self)
        self._world.check()  # bad --iface or --launcher: ValueError before anything starts
        session().last_spec = self.spec
        self._world.start(quiet, since)
        self._follow_heal_flag()

    def _follow_heal_flag(self) -> None:
        """A healer while ``spec.heal`` is set (``--heal``), none otherwise (``--no-heal``)."""
        if self.spec.heal and self.healer is None:
            self.healer = Healer(self._heal, lambda text: Router.write("stderr", text + "\n"),
                                 lambda r: self.ranks[r].label())
        elif not self.spec.heal and self.healer is not None:
            self.healer.stop()  # from its own thread too: it returns after this heal
            self.healer = None

    def _became_current(self) -> None:
        session().latest = self

    def _stopped(self) -> None:
        if session().latest is self:
            session().latest = None

    # ------------------------------------------------------------------ cells
    def run(self, code: str, ranks: Any = None, timeout: float | None = None,
            show: bool = True, grid: bool = False,
            aggregate: bool | None = None) -> dict[int, str | None]:
        """Run ``code`` on worker ranks; returns rank -> repr of the last expression.

        Output streams into the current cell as it is printed; the last expression of each
        rank is printed as ``[name] value`` when ``show`` (a value with a rich repr shows as
        that). Displays and figures arrive as rich outputs labelled with the rank; ``grid``
        shows them at the end as one table, a column per rank. ``aggregate`` (True/False)
        overrides the world's setting for this cell: equal lines of several ranks shown
        once. Raises ``DistCellError`` naming every rank that failed, after the others'
        output was shown.
        """
        targets = parse_ranks(ranks, self.names)
        if not self.router.jupyter:  # in a notebook, each cell starts the limits over
            self.router.new_cell()
        with self.rich_cell(targets, grid=grid, results=show), \
                self.aggregating(aggregate, targets):
            exec_id = self.send_cell(code, targets)
            results = self.collect(exec_id, targets, timeout)
        return self.report(results, targets, show)

    def rich_cell(self, targets: list[int], grid: bool = False,
                  results: bool = True) -> AbstractContextManager[None]:
        """Around a cell on ``targets``: ``grid`` lays their rich outputs side by side at
        the end; ``results=False`` leaves rich last values unshown."""
        return self.cells.rich.cell(targets, grid=grid, results=results)

    def aggregating(self, on: bool | None, targets: list[int]) -> AbstractContextManager[None]:
        """Around a cell on ``targets``: ``on`` (True/False; None keeps the world's setting)
        says whether equal lines of several ranks show once; a held line waits only for
        ``targets``, and what is held is shown when the cell ends."""
        return self.router.aggregating(on, targets)

    def send_cell(self, code: str, targets: list[int]) -> int:
        """Hand a cell to the targets without waiting; returns the id ``collect`` takes."""
        return self.cells.send_cell(code, targets)

    def collect(self, exec_id: int, targets: list[int], timeout: float | None,
                partial: bool = False, announce: bool = True) -> dict:
        """Wait for a cell's results; interrupts and deaths are handled, never hangs
        (``Cells.collect``)."""
        return self.cells.collect(exec_id, targets, timeout, partial, announce)

    def first_failure(self, exec_id: int, targets: list[int]) -> int | None:
        """The worker that failed cell ``exec_id`` first, if any yet (``Cells.first_failure``)."""
        return self.cells.first_failure(exec_id, targets)

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
        exec_id = self.cells.next_id()
        self._require_running("debug a rank")
        if not self.cells.send(r, Debug(exec_id)):
            raise WorkerDiedError(r, self.names[r], self.ranks[r].reason(), "asked to debug")
        self.report(self.collect(exec_id, [r], None), [r], show=False)

    def _rpc_failed(self) -> int | None:
        dest = rpc_hooks.last_failed_destination()
        return self._world.rank_of(dest) if dest is not None else None

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

    def __getitem__(self, key: Any) -> View:
        """Worker ranks as one view: ``c[:]`` (every worker), ``c[1:3]``, ``c[[1, 3]]``,
        ``c["obs2"]``; see ``View`` (docs/guide/views.md)."""
        return View(lambda: self._world, select(key, self.names), self._load)

    # ------------------------------------------------------------------ status
    def status(self) -> StatusTable:
        """A table of every rank: pid, alive or how it died, CPU %, memory, uptime (ranks on
        other hosts: as their host's agent sampled them, at most a second ago)."""
        return collect_status(self, template_pid=session().template_pid(),
                              remote=remote_samples(self._world.agents))

    def hosts_status(self) -> HostTable:
        """One row per host of this world: its agent's pid, ranks, load and free memory
        (under ``--slurm``, a first line with the job, its state and time left)."""
        return host_status(self, self._world.agents,
                           allocation.describe(session().allocation) if self.spec.scheduled else "")

    def device(self, rank: int = 0) -> str | None:
        """``"cuda:i"`` where ``rank`` runs on a GPU in this world, else None."""
        return self.ranks[rank].device

    def worker_pids(self) -> list[int]:
        return [i.pid for r, i in self.ranks.items() if r != 0 and i.pid is not None]

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def _require_running(self, doing: str = "do that") -> None:
        other = current()
        if other is not None and other is not self:
            raise ClusterStateError(f"cannot {doing}: this handle's world was stopped; the "
                                    "running one is `nbdist.current()`")
        if not self._settled.is_set():  # --heal is rebuilding the world: wait for it
            self._settled.wait(self.spec.start_seconds() + 5.0)
        self.state.require(ClusterState.RUNNING, doing=doing)

    # ------------------------------------------------------------------ stop / restart
    def stop(self, timeout: float = 5.0, keep_logs: str | None = None) -> None:
        """Stop every worker and leave RPC in this process ready for a new world.

        ``keep_logs``: a directory to copy each rank's full output log into first.
        """
        self._call_off("the world was stopped")
        if self.healer is not None:
            self.healer.stop()
        with self._owning("stop"):
            if self.state in (ClusterState.STOPPING, ClusterState.STOPPED):
                return
            if self.running and not self._receiver.is_current_thread():
                self.flush(timeout=min(timeout, 1.0))  # the last RPC's output is still shown
            try:
                if keep_logs is not None:
                    self._copy_logs(keep_logs)
            finally:
                self._world.teardown(timeout)

    def _call_off(self, why: str) -> None:
        """No new rebuild starts in this world; one under way gives up at its next wait."""
        with self._guard:
            self._stop_asked = self._stop_asked or why

    def _cancelled(self) -> str:
        with self._guard:
            return self._stop_asked

    @contextlib.contextmanager
    def _owning(self, doing: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the lifecycle lock; a rebuild that holds it ends by its own start deadline
        (sooner once called off), so waiting longer than that is a bug, said as one."""
        timeout = self.spec.start_seconds() + 5.0 if timeout is None else timeout
        if not self._lifecycle.acquire(timeout=timeout):
            raise DistTimeoutError(f"cannot {doing}: timed out after {timeout:g}s waiting for "
                                   f"rank 0's {self.state.value} of this world to end")
        try:
            yield
        finally:
            self._lifecycle.release()

    def _give_way(self, why: str, timeout: float) -> None:
        """The process exits: call off a rebuild under way and let it tear down (bounded)."""
        self._call_off(why)
        if self._lifecycle.acquire(timeout=timeout):
            self._lifecycle.release()

    def _copy_logs(self, dest: str) -> None:
        os.makedirs(dest, exist_ok=True)
        self.router.flush()
        for path in self.router.log_paths().values():
            shutil.copy2(path, os.path.join(dest, os.path.basename(path)))

    def restart(self, n: int | None = None, *, keep: bool = False, quiet: bool = False,
                **changes: Any) -> Cluster:
        """Stop this world and start a new one; unspecified settings stay as they were
        (``hosts=()`` drops the hosts). Returns this ``Cluster``, now the handle of the new
        world (as ``nbdist.current()`` is).

        ``keep=True`` (``%dist_restart --keep``) rebuilds this world in place and returns
        this ``Cluster``: live workers keep their process and ``__main__`` (variables, open
        files, loaded data) and rejoin a new RPC world (RRefs, distributed-autograd contexts
        and the process group are new); dead ranks, and ranks a larger ``n`` adds, start
        fresh under their number and name; a smaller ``n`` stops the ranks beyond it. One
        line says which ranks kept their state. A rank whose host changes starts fresh.
        The line's time counts from this call (the old world's stop included).
        """
        since = time.monotonic()
        drop = _drops_scheduler(changes)  # before _changed, which takes them out
        spec = _changed(self.spec, n, changes)
        _refuse_a_second_world(self)
        if keep and spec.scheduled and spec.scheduler_options == self.spec.scheduler_options \
                and allocation.ended(spec, session().allocation):
            keep = False  # its ranks are gone: provide() asks again, and its line says so
        if keep and self.running:
            self._rebuild(spec, quiet, since=since)
            return self
        if keep and not quiet:
            print("nbdist: this world is not running, so no rank has state to keep; "
                  "starting a fresh one")
        self.stop()
        if drop:
            session().close_agents()
        return _start_new(spec, quiet, handle=self, since=since)

    def _rebuild(self, spec: WorldSpec, quiet: bool, healing: list[int] | None = None,
                 since: float | None = None) -> None:
        """``restart(keep=True)`` of a running world (``healing``: the ranks --heal replaces;
        ``since``: when the user asked, default now)."""
        since = time.monotonic() if since is None else since
        from ..patches.torch_private import usable

        if spec.rpc and not usable("restart"):  # every rank would wait in init_rpc
            raise StartError("this torch hides the RPC state nbdist resets between worlds "
                             "(see `%load_ext nbdist`'s report), so no rank can rejoin: "
                             "restart without --keep")
        old = self.spec
        for key in ("hosts", "iface", "launcher", "remote_python"):
            if getattr(spec, key) != getattr(old, key):
                raise ValueError(f"--keep cannot change {key.replace('_', '-')}: restart "
                                 "without --keep to change the machines of a world")
        if spec.world_size != old.world_size:
            phase = ClusterState.GROWING
        else:
            phase = ClusterState.HEALING if healing else ClusterState.RESTARTING
        with self._owning("restart keeping state"):
            if self._cancelled():
                if healing:
                    return  # the world is stopping: nothing to heal
                raise ClusterStateError("cannot restart keeping state: this world is "
                                        f"stopping ({self._cancelled()})")
            self._require_running("restart keeping state")
            if not self._receiver.is_current_thread():
                self.flush(timeout=1.0)
            placement = spec.placement()
            kept = {r for r, i in self.ranks.items() if r and r < spec.world_size
                    and i.alive and placement[r] == i.host}
            before = {r: (i.alive, i.reason()) for r, i in self.ranks.items() if r}
            epoch = next(session().epochs)
            self._settled.clear()
            try:
                self._world.rebuild(spec, spec.names(), epoch, kept, since, phase=phase,
                                    cancelled=self._cancelled)
            finally:
                self._settled.set()
            self.spec, self.names, self.epoch = spec, spec.names(), epoch
            self.router.aggregate = spec.aggregates()
            session().last_spec = spec
            self._follow_heal_flag()
            line = _kept_line(spec.world_size, self._world.startup_seconds, kept, before,
                              healing)
            events.event("heal" if healing else "restart", line)
            if healing:
                Router.write("stderr", line + "\n")
            elif not quiet:
                print(line)

    def _died(self, rank: int) -> None:
        """A worker of the running world exited (a launcher's reader thread)."""
        if self.healer is not None:
            self.healer.died(rank)

    def _heal(self, ranks: list[int]) -> None:
        """The healer's call: rebuild keeping every live rank, if the world still runs."""
        if self.running and any(not self.ranks[r].alive for r in ranks if r in self.ranks):
            try:
                self._rebuild(self.spec, quiet=True, healing=ranks)
            except Cancelled:
                pass  # a stop, restart or exit called it off; that one says what it did

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<nbdist.Cluster {self.state.value}: " + ", ".join(
            f"{r}={nm}" for r, nm in enumerate(self.names)) + ">"


def _give_way_at_exit() -> None:
    """First thing at exit: a heal or keep-restart under way gives up and tears its world
    down while the template still reports its workers' exits (bounded: Jupyter gives a
    kernel a few seconds)."""
    if session().latest is not None:
        session().latest._give_way("the process is exiting", timeout=3.0)


def _stop_at_exit() -> None:
    """The process is exiting: stop its world quickly (after the template and agents)."""
    if session().latest is not None:
        session().latest.stop(timeout=1.0)


def _kept_line(size: int, seconds: float, kept: set[int], before: dict[int, tuple],
               healing: list[int] | None) -> str:
    """The one line a keep-restart prints: which ranks kept their state, which came back
    empty and why, which were stopped."""
    fresh = []
    for r in range(1, size):
        if r in kept:
            continue
        if r not in before:
            fresh.append((r, "new"))
        elif not before[r][0]:
            fresh.append((r, before[r][1]))
        else:
            fresh.append((r, "moved host"))
    stopped = sorted(r for r in before if r >= size)
    head = "healed" if healing else f"{size} ranks ready"
    parts = [f"kept state: {_ranks(sorted(kept))}" if kept else "no rank kept state"]
    if fresh:
        parts.append("fresh: " + _fresh(fresh))
    if stopped:
        parts.append(f"stopped: {_ranks(stopped)}")
    return f"nbdist: {head} in {seconds:.2f}s; " + "; ".join(parts)


def _ranks(ranks: list[int]) -> str:
    return numbers(ranks)


def _fresh(fresh: list[tuple[int, str]]) -> str:
    """``2 (killed by SIGKILL), 5 (new)``; past ``SMALL`` ranks grouped by why,
    ``5-255 (new)``."""
    if len(fresh) <= SMALL:
        return ", ".join(f"{r} ({why})" for r, why in fresh)
    return ", ".join(f"{spans(r for r, _ in same)} ({why})"
                     for why, same in grouped(fresh, lambda item: item[1]))


session().before_exit.append(_give_way_at_exit)
session().on_exit.append(_stop_at_exit)
