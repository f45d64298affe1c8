"""The start sequence of a world and rank 0's own part in it (join and leave torch RPC).

fork workers → accept their authenticated connections → rank 0 joins ``init_rpc`` (in a
thread it owns, bounded by the start deadline) → every worker says ready → every worker
answers a first RPC. Each wait watches the clock and the workers' lives and names the ranks
it waited for.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..control.channel import HandshakeError, Listener
from ..control.protocol import Hello, ProtocolError
from ..devices import Setup
from ..errors import DistTimeoutError, StartError, WorkerDiedError
from ..groups import torchrun_env
from ..hosts.netif import Interface
from ..output.router import Router, StatusLine
from ..patches import gloo_timeout, quiet, rpc_agent, rpc_hooks, rref_reset, tp_address
from ..patches.torch_private import report_once
from ..proc import membership
from ..proc.backlog import Widener
from ..rank_config import RankConfig
from ..rank_info import RankInfo, describe_exit
from ..rank_sets import SMALL, labels
from ..shm import transport as shm
from ..spec import SHM_TRANSPORT_UP_TO, WorldSpec

__all__ = ["ARRIVED", "Cancelled", "Rank0", "StartWatch", "arrival_file", "torch_iface",
           "user_group_file", "worker_config"]

_DEADLINE_SLACK = 0.5  # a torch wait ending this close to the start deadline is its timeout


def worker_config(spec: WorldSpec, names: list[str], rank: int, world_dir: str,
                  socket: str | tuple, key: bytes, epoch: int,
                  group: tuple[str | None, str], store: tuple | None = None,
                  ifname: str = "lo", gpu: Setup | None = None,
                  share: tuple | None = None,
                  master: dict[str, str] | None = None) -> RankConfig:
    """Everything a rank needs to become ``rank``: a forked worker, or rank 0 (the notebook
    takes what applies to it: its name, group, rendezvous, device).

    ``group`` (``rank_config.world_group``) is the default process group's backend and why.

    ``master`` (``torchrun_env.master``): ``MASTER_ADDR``/``MASTER_PORT``, the same for every
    rank.

    ``share`` (``(NodeShare, k)``: the rank is the k-th of its node in a scheduler's
    allocation) gives it the threads and CPUs of its share of the node (``cpu_share``: its
    agent binds it to its part of the CPUs the step holds), ``LOCAL_RANK`` k and its GPU.

    ``gpu`` (the world's ``devices.Setup``) gives the rank its device (``LOCAL_RANK`` and
    ``NBDIST_DEVICE`` in its environment) and its device maps.

    In a world with hosts (``store`` given) the rendezvous goes through the notebook's store
    and torch's sockets use ``ifname``; a rank on another host gets ``env_extra`` instead of
    the notebook's environment, and its agent completes the config (``hosts.join_agent``).
    """
    host = spec.placement()[rank]
    launch_env = {**torchrun_env.variables(rank, spec.placement()), **(master or {})}
    ours = {"NBDIST_RANK": str(rank), "NBDIST_WORLD_SIZE": str(spec.world_size), **launch_env}
    device = gpu.device(rank) if gpu is not None else None
    if host is None:
        ours.update({"LOCAL_RANK": str(rank), "NBDIST_DEVICE": device or "cpu"})
        env = dict(os.environ)
        env.update(spec.env)
        threads: int | None = spec.thread_count()
        env.update({"TP_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname,
                    "OMP_NUM_THREADS": str(threads), **ours})
        extra = None
    else:
        env, threads, extra = None, spec.threads, {**spec.env, **ours}
        if share is not None:
            node, local = share
            threads = spec.threads or node.threads()
            extra.update({"LOCAL_RANK": str(local), "NBDIST_DEVICE": device or "cpu",
                          "OMP_NUM_THREADS": str(threads)})
    rendezvous = _rendezvous(world_dir, epoch, hosted=store is not None)
    backend, why = group
    return RankConfig(
        rank=rank, name=names[rank], world_size=spec.world_size,
        socket=socket, authkey=key, cwd=os.getcwd(),
        env=env, env_extra=extra, path=list(sys.path), threads=threads,
        host=host, host_ranks=dict(spec.hosts).get(host, 0),
        cpu_share=(share[1], share[0].ranks) if share is not None else None,
        rpc=spec.rpc, rpc_init=rendezvous["rpc"], rpc_timeout=spec.rpc_timeout,
        rpc_threads=16, process_group=backend, group_why=why,
        device=device, device_maps=gpu.maps.get(names[rank]) if gpu else None,
        pg_init=rendezvous["pg"], pg_timeout=spec.rpc_timeout,
        start_timeout=spec.start_seconds(), epoch=epoch, store=store,
        arrivals=None if store else arrival_file(world_dir, epoch), arrived=ARRIVED,
        shm=shm.world_config(spec.placement(), names, rank) if spec.rpc else None,
        user_groups=None if store else user_group_file(world_dir, epoch),
        launch_env=launch_env, tp_transports=spec.tp_transports(),
    )


ARRIVED = "nbdist/arrived/{rank}"  # a worker of a world without RPC is about to join its group


def arrival_file(world_dir: str, epoch: int) -> str:
    """Where the workers of a local world without RPC say they arrived (a ``FileStore``,
    one per epoch: a kept world is rebuilt in the same directory)."""
    return os.path.join(world_dir, f"arrivals-{epoch}")


def user_group_file(world_dir: str, epoch: int) -> str:
    """The store of the groups user code makes with ``init_process_group`` in a local world
    (``patches.process_group``; one per epoch, keys of each group under its own prefix)."""
    return os.path.join(world_dir, f"user-groups-{epoch}")


def _rendezvous(world_dir: str, epoch: int, hosted: bool) -> dict[str, str]:
    """init_method of the RPC world and of the process group: files of the world directory
    named for the epoch (a kept world is rebuilt in the same directory), or in a world with
    hosts the notebook's store (``proc.store``; a fresh one each time)."""
    if hosted:
        from ..proc.store import rendezvous_url  # imports torch: only once a world starts

        return {p: rendezvous_url(p) for p in ("rpc", "pg")}
    return {p: f"file://{world_dir}/{p}-{epoch}" for p in ("rpc", "pg")}


class Cancelled(StartError):
    """A start or rebuild was called off from outside (a stop, a restart, the process
    exiting); the world is torn down, as after any failed start."""


class StartWatch:
    """Deadline and liveness checks shared by every step of one start."""

    def __init__(self, ranks: dict[int, RankInfo], deadline: float, timeout: float,
                 cv: threading.Condition, cancelled: Callable[[], str] | None = None) -> None:
        self.ranks, self.deadline, self.timeout, self.cv = ranks, deadline, timeout, cv
        self.cancelled = cancelled  # says why the start was called off ("" while it is not)

    def check(self, waiting: set[int], what: str, cancellable: bool = True) -> None:
        """Raise if the start was called off (``Cancelled``; not while ``cancellable`` is
        False: rank 0 inside ``init_rpc`` finishes joining its live peers first, so no thread
        is left in torch), a rank in ``waiting`` died or the deadline passed."""
        why = self.cancelled() if cancellable and self.cancelled is not None else ""
        if why:
            raise Cancelled(why)
        for r in sorted(waiting):
            info = self.ranks.get(r)
            if info is not None and info.exit_code is not None:
                if info.failure:
                    raise StartError(f"{info.label()} failed while {what}: "
                                     f"{describe_exit(info.exit_code)}\n\nits traceback:\n"
                                     f"{info.failure}")
                raise WorkerDiedError(r, info.name, info.reason(), what)
        if time.monotonic() > self.deadline:
            raise self.timed_out(waiting, what)

    def timed_out(self, waiting: set[int], what: str) -> DistTimeoutError:
        """The error for a deadline that passed while ``waiting`` had not done ``what``."""
        who = ", ".join(self.ranks[r].label() for r in sorted(waiting)) \
            if len(waiting) <= SMALL else labels((r, self.ranks[r].name) for r in waiting)
        return DistTimeoutError(f"timed out after {self.timeout:g}s waiting for {who} to {what}")

    def accept_all(self, listener: Listener, expect: set[int] | None = None) -> None:
        """Take one authenticated connection per worker forked for this world (``expect``,
        default every worker); strays are dropped, not fatal."""
        missing = {r for r in self.ranks if r} if expect is None else set(expect)
        while missing:
            self.check(missing, "connect to the notebook")
            try:
                chan = listener.accept(0.1, name="worker")
            except DistTimeoutError:
                continue
            except HandshakeError as exc:
                Router.write("stderr", f"nbdist: ignored a connection to the control socket: "
                                       f"{exc}\n")
                continue
            try:
                hello = chan.recv(timeout=max(min(self.deadline - time.monotonic(), 5.0), 0.01))
            except (DistTimeoutError, ProtocolError, EOFError, OSError):
                chan.close(timeout=0)
                continue
            info = self.ranks.get(hello.rank) if isinstance(hello, Hello) else None
            if info is None or hello.rank not in missing or hello.pid != info.pid:
                chan.close(timeout=0)
                continue
            chan.name = info.label()
            info.channel = chan
            missing.discard(hello.rank)

    def wait_ready(self, what: str = "join the RPC world") -> None:
        """Every worker joined; past ``StatusLine.AFTER`` seconds a line counts them in place."""
        started = time.monotonic()
        status: StatusLine | None = None
        next_status = started + StatusLine.AFTER
        with self.cv:
            while True:
                missing = {r for r, i in self.ranks.items() if not i.ready}
                now = time.monotonic()
                if status is not None and (not missing or now >= next_status):
                    n = len(self.ranks)
                    status.show(f"nbdist: {n - len(missing)}/{n} ranks ready "
                                f"({now - started:.1f}s)")
                    next_status = now + StatusLine.EVERY
                if not missing:
                    return
                if status is None and now >= next_status:
                    status = StatusLine()
                    continue
                self.check(missing, what)
                self.cv.wait(0.05)

    def ping_all(self) -> None:
        """Every worker answers one RPC (so the world is really up)."""
        import torch.distributed.rpc as rpc

        futs = {r: rpc.rpc_async(self.ranks[r].name, os.getpid) for r in self.ranks if r}
        for r, fut in futs.items():
            while not fut.done():
                self.check({r}, "answer its first RPC")
                time.sleep(0.002)
            fut.wait()


class Rank0(membership.Steps):
    """The notebook's own membership in a world: ``membership.join``'s steps taken the way
    rank 0 takes them (each blocking call in an owned thread that watches the workers and
    the start deadline; the rendezvous opened here; the workers waited for before a group
    without RPC), and leaving at stop. ``cfg`` is rank 0's, from ``worker_config`` like
    every worker's; ``store`` is a world with hosts' store itself (None: files)."""

    notebook = True

    def __init__(self, cfg: RankConfig, store: Any = None,
                 iface: Interface | None = None) -> None:
        super().__init__(cfg)
        self.store = store
        self.ifname = iface.name if iface is not None else "lo"
        self.address = iface.address if iface is not None else "127.0.0.1"
        self.rpc_up = False
        self.pg_up = False
        self.joiner: threading.Thread | None = None
        self.rpc_store: Any = None  # rank 0's closable RPC rendezvous in a local world
        self.watch: StartWatch | None = None  # the start this join belongs to
        self.left = 1.0  # seconds of the start deadline left as init_rpc began
        self.widened: list[int] = []  # ports of the listeners a big world's join widened
        self._excepthook = sys.excepthook  # init_process_group wraps it; leave() restores it

    def join(self, watch: StartWatch) -> None:
        """Join the world as rank 0 (``membership.join``), within ``watch``'s deadline."""
        self.watch = watch
        for line in report_once():  # unless %load_ext said it: what degrades
            Router.write("stderr", line + "\n")
        membership.join(self.cfg, self)

    # -- membership.Steps, rank 0's way ---------------------------------------------------
    def run(self, fn: Callable[[], Any], what: str) -> None:
        """Run a blocking torch call in a thread while watching the workers and the clock."""
        watch = self.watch
        assert watch is not None
        box: dict = {}

        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc

        # a big world's ranks all connect to rank 0 as init_rpc ends: its listeners get long
        # queues as soon as they open (backlog.py), looked for every 10 ms until it returns
        widener = Widener() if ("init_rpc" in what
                                and self.cfg.world_size > SHM_TRANSPORT_UP_TO) else None
        self.joiner = threading.Thread(target=target, daemon=True, name="nbdist-join")
        self.joiner.start()
        workers = {r for r in watch.ranks if r}
        while self.joiner.is_alive():
            if widener is not None:
                widener.scan()
            self.joiner.join(0.01 if widener is not None else 0.05)
            if self.joiner.is_alive():
                watch.check(workers, what, cancellable=False)
        self.widened = widener.widened if widener is not None else []
        if "error" not in box or "init_rpc" not in what:
            self.joiner = None
        # else kept: an init_rpc that failed after setting its agent (its last all-gather
        # met a peer that died) left that agent current, and ``Session.settle_joiner`` drops
        # it before the next init_rpc (issue 45, seed 16)
        if "error" in box:
            # torch's own waits are bounded by the same deadline, so they can end a moment
            # before this loop sees it pass: a rank that died or a deadline that passed
            # explains the failure better than Gloo's bare "Wait timeout"
            watch.check(workers, what)
            if time.monotonic() > watch.deadline - _DEADLINE_SLACK:
                raise watch.timed_out(workers, what) from box["error"]
            raise box["error"]

    def world_store(self) -> Any:
        """A world with hosts' store itself (the workers reach it over their connections)."""
        return self.store

    def user_group_store(self) -> Callable[[], Any]:
        if self.store is not None:
            hosted = self.store
            return lambda: hosted
        return super().user_group_store()

    def without_rpc(self) -> None:
        """No RPC patches, no RRef or address resets: nothing of torch RPC is touched (the
        world already said it has no RPC, ``no_rpc.enter``)."""
        quiet.install()
        quiet.hide_warnings()

    def arrive(self, arrivals: Any) -> None:
        """Wait until every worker said it is about to join the group: a rank that never
        comes fails the start at its deadline, named, and no thread of rank 0 is left in
        Gloo's rendezvous (which waits for the group's whole timeout)."""
        watch = self.watch
        assert watch is not None
        missing = {r for r in watch.ranks if r}
        while missing:
            missing = {r for r in missing if not arrivals.check([ARRIVED.format(rank=r)])}
            if missing:
                watch.check(missing, "join the process group")
                time.sleep(0.01)

    def before_rpc(self) -> None:
        """Forget the last world's RPC state, and bound the joining waits by what is left
        of the start deadline, so the joining thread ends by then even if the workers never
        come (the world's own RPC timeout is set once joined)."""
        rpc_hooks.reset_world_state()
        quiet.install()
        if not rref_reset.reset_singleton() and self.cfg.epoch > 1:
            Router.write("stderr", "nbdist: this torch build hides its RRef context, so RRefs "
                                   "in this notebook may fail after a restart; restart the "
                                   "kernel if they do\n")
        quiet.hide_warnings()
        if not tp_address.pin(self.address) and tp_address.current() not in (None,
                                                                               self.address):
            raise StartError(f"rank 0's RPC address is fixed at {tp_address.current()} in "
                             f"this process (this torch build hides it from nbdist), so it "
                             f"cannot listen on {self.address}; restart the kernel and "
                             "start this world first")
        assert self.watch is not None
        self.left = max(self.watch.deadline - time.monotonic(), 1.0)

    def rpc_options(self) -> tuple[str, float, int | None]:
        init = self.cfg.rpc_init if self.store is not None else self._closable_rpc_store(
            self.cfg.rpc_init, self.left)
        return init, self.left, None

    def torch_calls(self) -> contextlib.AbstractContextManager[Any]:
        calls = contextlib.ExitStack()
        calls.enter_context(torch_iface(self.ifname))
        if self.cfg.rpc:
            calls.enter_context(_gloo_timeout(self.left))
        return calls

    def after_rpc(self) -> None:
        self.rpc_up = True
        rpc_agent.set_default_timeout(self.cfg.rpc_timeout)

    def after_group(self) -> None:
        self.pg_up = True

    # -------------------------------------------------------------------------------------
    def _closable_rpc_store(self, file_url: str, timeout: float) -> str:
        """Rank 0's side of a local world's RPC rendezvous (``file_url``'s file, which the
        workers open themselves) as a ``ClosableStore``, so ``leave`` ends its waits."""
        import torch.distributed as dist

        from ..proc import store

        self.rpc_store = store.ClosableStore(
            dist.FileStore(file_url[len("file://"):], self.cfg.world_size), timeout)
        store.use(self.rpc_store)
        return store.rendezvous_url("rpc")

    def leave(self) -> None:
        """Leave the world without waiting for peers; ready for the next ``init_rpc``.

        After a failed start ``joiner`` may still be inside ``init_rpc``, or have ended
        having set an agent; the session settles it before the next start
        (``Session.settle_joiner``: waits, releases or abandons it, drops its agent).
        """
        # a world without RPC touched none of torch RPC's state: nothing of it to reset
        membership.leave(group=self.pg_up, rpc_agent=self.rpc_up, reset_rpc=self.cfg.rpc)
        if self.rpc_store is not None:  # a joining thread left waiting on it ends now
            self.rpc_store.close()
        if self.pg_up:
            self.pg_up = False
            sys.excepthook = self._excepthook  # else each world adds one more "[rank0]:"
        self.rpc_up = False


def _gloo_timeout(seconds: float) -> contextlib.AbstractContextManager[None]:
    """Bound the Gloo group ``init_rpc`` builds (torch gives it 24 days) while rank 0 joins."""
    return gloo_timeout.bounded(seconds)


class torch_iface:  # noqa: N801 - used as a context manager, like a function
    """Make torch's TensorPipe and Gloo listen on one interface (loopback unless the world
    spans hosts) while rank 0 joins."""

    def __init__(self, ifname: str = "lo") -> None:
        self.keys = {"TP_SOCKET_IFNAME": ifname, "GLOO_SOCKET_IFNAME": ifname}

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.keys}
        os.environ.update(self.keys)

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
