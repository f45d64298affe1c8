"""``mp.spawn(fn, args, nprocs=K)`` from a cell runs ``fn(i, *args)`` on the K ranks of a world.

``take`` (asked by ``patches.mp_spawn``) returns ``DECLINE`` where torch's own spawn would work: no
world is running and ``fn`` and ``args`` reach a fresh interpreter by reference (not from a
notebook's ``__main__``), or ``start_processes`` forks. Otherwise the notebook is process 0 and
worker rank i is process i, as in ``%%dist --local`` (``spawn.one_rank``); with no world one of K
ranks is started, and a world of another size is keep-restarted to K ranks (one line says which).
Spawn's contract holds: it returns when every process returned; a failure raises torch's
``ProcessRaisedException`` naming the process, or ``ProcessExitedException`` for a rank that died;
``join=False`` returns a ``ProcessContext`` whose ``join(timeout)`` works as torch's does. Ctrl-C
interrupts every rank.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from ..cluster import core
from ..cluster.failfast import FailFast
from ..errors import DistTimeoutError, RankFailure
from ..patches import mp_spawn as patch
from ..spawn import one_rank as spawned
from ..thread_raise import raise_in

__all__ = ["AFTER_FAILURE", "BARE", "install", "starts_rpc", "take"]

# How long the other ranks may still take after one failed: they are probably waiting in a
# collective for it; then they are interrupted and the failure is raised.
AFTER_FAILURE = 5.0
# a world that a spawn starts for itself, or restarts for a function that starts RPC: no RPC
# agent, no process group, as a spawned process begins
BARE = {"rpc": False, "process_group": "none"}
_MISSING = object()  # a rank whose result was not collected (interrupted after a failure)
_GENERATIONS_PER_PROCESS = itertools.count(1)  # spawns run from this notebook (``spawned.call``)


def install() -> None:
    """Let ``mp.spawn`` and ``mp.start_processes`` ask this module (idempotent)."""
    patch.attach(take)
    patch.install()


def take(fn: Callable, args: tuple, nprocs: int, join: bool, daemon: bool,
         start_method: str) -> Any:
    """``start_processes``' call, run in a world; ``patch.DECLINE`` where torch's own spawn
    should run it."""
    if os.environ.get("NBDIST_RANK") is not None or nprocs < 1:
        return patch.DECLINE  # on a worker, or nothing to start: torch's own
    cluster = core.current()
    if cluster is None and (start_method == "fork" or _plain_spawn_works(fn, args)):
        return patch.DECLINE  # a forked child has the notebook's __main__: torch's own works
    cluster = _world_of(cluster, nprocs, getattr(fn, "__qualname__", repr(fn)),
                        starts_rpc(fn))
    run = _Spawn(cluster, fn, args, nprocs)
    if not join:
        run.start_thread()
        return run.context()
    with (cluster.rich_cell(run.targets, results=False) if cluster is not None
          else contextlib.nullcontext()):
        run.run_here()
        run.finish()
    return None


def _plain_spawn_works(fn: Callable, args: tuple) -> bool:
    """Whether torch's spawn could run ``fn(i, *args)``: both pickle by reference, and not
    from the ``__main__`` of an interactive shell (a fresh interpreter cannot import it; a
    script's ``__main__`` is run again there)."""
    try:
        data = pickle.dumps((fn, args))
    except Exception:  # noqa: BLE001 - a lambda, a closure, a local class...
        return False
    ipython = sys.modules.get("IPython")
    interactive = ipython is not None and ipython.get_ipython() is not None
    return not (interactive and b"__main__" in data)


def _world_of(cluster: core.Cluster | None, nprocs: int, what: str,
              own_rpc: bool = False) -> core.Cluster | None:
    """A running world of ``nprocs`` ranks (None for one process: the notebook alone);
    ``own_rpc``: the function calls ``init_rpc`` itself, so a world with RPC is
    keep-restarted bare for it."""
    if nprocs == 1:
        if cluster is not None:
            print(f"nbdist: mp.spawn({what}, nprocs=1) runs process 0 here, in the notebook; "
                  "the world's workers take no part")
        return None
    t0 = time.monotonic()
    if cluster is None:
        cluster = core.start(nprocs - 1, quiet=True, **BARE)
        print(f"nbdist: mp.spawn({what}, nprocs={nprocs}) started a world of {nprocs} ranks "
              f"in {time.monotonic() - t0:.2f}s: the notebook is process 0, worker i process "
              "i; like spawned processes, they have no RPC agent and no process group until "
              "the function makes them; it stays up for the next spawn (`%dist_stop` ends it)")
        return cluster
    size = cluster.world_size
    if own_rpc and cluster.rpc:
        return _bare(cluster, nprocs, what, t0)
    if size == nprocs:
        return cluster
    local = cluster.spec.n + nprocs - size  # ranks on other hosts stay as they are
    if local < 0:
        raise ValueError(f"mp.spawn(nprocs={nprocs}) asks for fewer processes than this "
                         f"world has on other hosts ({size - 1 - cluster.spec.n}): "
                         "`%dist_restart` it with fewer ranks there (--hosts)")
    kept = [r for r, i in cluster.ranks.items() if 0 < r < nprocs and i.alive]
    cluster = cluster.restart(local, keep=True, quiet=True)
    ranks = ", ".join(map(str, kept)) if kept else "none"
    print(f"nbdist: mp.spawn({what}, nprocs={nprocs}) in a world of {size} ranks: "
          f"keep-restarted it to {nprocs} ranks in {time.monotonic() - t0:.2f}s "
          f"(kept state: {ranks})")
    return cluster


def _bare(cluster: core.Cluster, nprocs: int, what: str, t0: float) -> core.Cluster:
    """``cluster`` (which has RPC) keep-restarted to ``nprocs`` bare ranks: the function
    starts RPC itself, which an agent already running would refuse ("already initialized")."""
    local = cluster.spec.n + nprocs - cluster.world_size
    if local < 0 or cluster.spec.hosts:
        raise ValueError(f"mp.spawn({what}) calls rpc.init_rpc itself, so this world's RPC "
                         "agent must go first, and a world with ranks on other hosts is not "
                         "restarted for it: `%dist_restart --no-rpc --keep` it first")
    kept = [r for r, i in cluster.ranks.items() if 0 < r < nprocs and i.alive]
    cluster = cluster.restart(local, keep=True, quiet=True, **BARE)
    print(f"nbdist: mp.spawn({what}, nprocs={nprocs}) calls rpc.init_rpc itself, as a spawned "
          f"process does: keep-restarted this world to {nprocs} ranks without RPC agent or "
          f"process group in {time.monotonic() - t0:.2f}s (kept state: "
          f"{', '.join(map(str, kept)) or 'none'}); `%dist_restart --rpc` brings RPC "
          "back")
    return cluster


def starts_rpc(fn: Callable, depth: int = 3) -> bool:
    """Whether ``fn``, or a function it names (``depth`` calls down), names ``init_rpc``:
    a script-style RPC program (it starts its own agent) rather than code for a world."""
    seen: set[int] = set()

    def codes(code: Any) -> Iterator[Any]:
        yield code
        for const in code.co_consts:
            if hasattr(const, "co_names"):
                yield from codes(const)

    def visit(f: Any, left: int) -> bool:
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen:
            return False
        seen.add(id(code))
        scope = getattr(f, "__globals__", {})
        for c in codes(code):
            if "init_rpc" in c.co_names:
                return True
            if left > 0 and any(visit(scope.get(n), left - 1) for n in c.co_names):
                return True
        return False

    return visit(fn, depth)


class _Spawn:
    """One spawn: the workers' cell is out; rank 0's part runs here; then the results."""

    def __init__(self, cluster: core.Cluster | None, fn: Callable, args: tuple,
                 nprocs: int) -> None:
        self.cluster, self.fn, self.args = cluster, fn, args
        self.targets = list(range(1, nprocs))
        self.failure: tuple[BaseException, str] | None = None  # rank 0's error, traceback
        self.failed_at = 0.0  # when (time.monotonic()) rank 0's failure happened
        self.thread: threading.Thread | None = None
        self.done = False
        self.generation = next(_GENERATIONS_PER_PROCESS)
        self.exec_id = cluster.send_cell(spawned.cell(fn, args, self.generation), self.targets) \
            if cluster is not None else None

    # -- rank 0 ---------------------------------------------------------------------------
    def run_here(self) -> None:
        """``fn(0, *args)`` on this thread; Ctrl-C interrupts every rank and is raised. A
        worker that fails meanwhile interrupts this part and the other workers, as torch's
        spawn ends the other processes (``FailFast``); its failure is the spawn's error."""
        watch = FailFast(self.cluster, self.exec_id, self.targets) \
            if self.cluster is not None and self.targets else None
        try:
            with watch.rank0() if watch is not None else contextlib.nullcontext():
                spawned.call(self.fn, 0, self.args, self.generation)
        except BaseException as exc:  # noqa: BLE001 - raised as spawn's error by finish()
            consequence = watch is not None and watch.first is not None
            if isinstance(exc, KeyboardInterrupt) and not consequence \
                    and threading.current_thread() is threading.main_thread():
                self._interrupt_workers()
                raise
            self.failure = (KeyboardInterrupt(), "KeyboardInterrupt\n") \
                if consequence or isinstance(exc, KeyboardInterrupt) \
                else (exc, traceback.format_exc())
            self.failed_at = time.monotonic()

    def start_thread(self) -> None:
        self.thread = threading.Thread(target=self.run_here, name="nbdist-spawn-0",
                                       daemon=True)
        self.thread.start()

    def context(self) -> Any:
        return _context_class()(self)

    # -- everything -----------------------------------------------------------------------
    def ready(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` (None: no limit) for rank 0's thread and the workers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                return False
        if self.cluster is None or deadline is None:
            return True
        while self.cluster.cells.pending(self.exec_id, self.targets):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def finish(self) -> None:
        """Collect the workers (Ctrl-C interrupts them); raise the first failure."""
        if self.done:
            return
        self.done = True
        results: dict = {}
        if self.cluster is not None and self.targets:
            wait = AFTER_FAILURE if self.failure is not None else None
            try:
                results = self.cluster.collect(self.exec_id, self.targets, wait, announce=False)
            except DistTimeoutError:
                results = {}  # interrupted: rank 0's failure is the news
        self._raise_first(results)

    def interrupt(self) -> None:
        """Ctrl-C during ``join``: every rank, rank 0's thread included."""
        self._interrupt_workers()
        t = self.thread
        if t is not None and t.is_alive() and t.ident is not None:
            raise_in(t.ident, KeyboardInterrupt)

    def _interrupt_workers(self) -> None:
        if self.cluster is not None and self.targets:
            self.cluster.interrupt(self.targets)
            try:
                self.cluster.collect(self.exec_id, self.targets, 0.5, announce=False)
            except (DistTimeoutError, KeyboardInterrupt):
                pass
            self.done = True

    def _raise_first(self, results: dict) -> None:
        failures: list[RankFailure] = []
        names = self.cluster.names if self.cluster is not None else ["the notebook"]
        if self.failure is not None:
            exc, tb = self.failure
            failures.append(RankFailure(0, names[0], type(exc).__name__, str(exc), tb))
        died = []
        for r in self.targets:
            res = results.get(r, _MISSING)
            if res is None:
                died.append(r)
            elif res is not _MISSING and res.status != "ok":
                failures.append(RankFailure(r, names[r], res.error_type, res.error,
                                            _without_stub(res.traceback)))
        if failures:
            when = {0: self.failed_at, **getattr(results, "finished", {})}
            first = min(failures, key=lambda f: (_secondary(f), when.get(f.rank, 0.0)))
            raise _error(first, failures, self._pid(first.rank))
        if died:
            assert self.cluster is not None
            info = getattr(results, "sent", {}).get(died[0]) or self.cluster.ranks[died[0]]
            from torch.multiprocessing.spawn import ProcessExitedException

            code = info.exit_code if info.exit_code is not None else -9
            raise ProcessExitedException(
                f"process {died[0]} ({info.name}) {info.reason()}", died[0],
                info.pid or -1, code, None)

    def _pid(self, rank: int) -> int:
        if rank == 0 or self.cluster is None:
            return os.getpid()
        return self.cluster.ranks[rank].pid or -1


def _secondary(f: RankFailure) -> bool:
    """A failure caused by another's: interrupted after it, or a collective whose peer left
    (a rank that raised ends its group, so its peers' waits may fail before its own result
    arrives: "closed by peer"). Among the rest, the first to fail is spawn's error."""
    return f.etype == "KeyboardInterrupt" or "by peer" in f.message


def _without_stub(text: str) -> str:
    """A worker's traceback without the frame of the two-line cell that called ``run``."""
    lines = text.splitlines(True)
    if len(lines) > 2 and lines[1].lstrip().startswith('File "<dist-cell-'):
        rest = 2
        while rest < len(lines) and not lines[rest].startswith("  File "):
            rest += 1
        lines = lines[:1] + lines[rest:]
    return "".join(lines)


def _error(first: RankFailure, failures: list[RankFailure], pid: int) -> Exception:
    """Spawn's error for the first failed process, as torch words it, plus the rank's name
    and which other ranks failed too."""
    msg = (f"\n\n-- Process {first.rank} ({first.name}) terminated with the following "
           f"error:\n{first.traceback}")
    others = [f"{f.rank} ({f.name}: {f.etype})" for f in failures if f is not first]
    if others:
        msg += f"\n(also failed: {', '.join(others)})\n"
    return _raised_class()(msg, first.rank, pid)


@functools.cache
def _raised_class() -> type:
    from torch.multiprocessing.spawn import ProcessRaisedException

    class SpawnedRankError(ProcessRaisedException):
        """spawn's ``ProcessRaisedException`` from a rank of an nbdist world."""

        def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
            super().__init__(msg, error_index, error_pid)
            # torch <= 2.8 stores the pid as ``pid`` only, later ones as ``error_pid`` only
            self.error_pid = self.pid = error_pid

        def _render_traceback_(self) -> list[str]:
            """IPython shows the rank's traceback, not nbdist's frames."""
            return [f"ProcessRaisedException: {self.msg.strip()}"]

    SpawnedRankError.__module__ = ProcessRaisedException.__module__
    return SpawnedRankError


@functools.cache
def _context_class() -> type:
    from torch.multiprocessing.spawn import ProcessContext

    class SpawnedContext(ProcessContext):
        """What ``mp.spawn(..., join=False)`` returns in a world: ``join`` as torch's."""

        def __init__(self, run: _Spawn) -> None:  # no processes of its own to watch
            self._run = run
            self.processes: list = []
            self.error_files: list = []
            self.sentinels: dict = {}

        def pids(self) -> list[int]:
            return [self._run._pid(r) for r in [0, *self._run.targets]]

        def join(self, timeout: float | None = None, grace_period: float | None = None
                 ) -> bool:
            """True once every process returned; False if some still run after
            ``timeout``; raises the first failure (``grace_period`` is not needed: ranks
            are interrupted, never killed)."""
            run = self._run
            if run.done:
                return True
            try:
                if not run.ready(timeout):
                    return False
                run.finish()
            except KeyboardInterrupt:
                run.interrupt()
                raise
            return True

    return SpawnedContext
