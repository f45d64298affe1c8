"""``Cluster``: one local RPC world with the notebook as rank 0; start, run, status, stop.

One cluster is active per notebook process. Workers are forked from a warm template process
(``launch.Template``) that survives between worlds, so a restart skips ``import torch``. Every
wait polls with a deadline and checks whether the rank it waits on is still alive.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_any
from typing import Any

from ..errors import (
    ClusterStateError,
    DistCellError,
    DistTimeoutError,
    RankFailure,
    StartError,
    WorkerDiedError,
)
from ..patches import quiet, rpc_hooks, rref_reset, shipping
from ..proc.channel import Channel, Listener
from ..proc.launch import Template, describe_exit
from ..proc.output import Router
from ..proc.runtime import pid_alive, runtime_dir
from ..spec import WorldSpec, parse_ranks
from ..telemetry import records
from .status import StatusTable, collect_status

__all__ = ["Cluster", "current", "start", "stop"]

_current: Cluster | None = None
_template: Template | None = None
_runtime_dir: str | None = None
_exec_ids = itertools.count(1)
_last: WorldSpec | None = None
_epochs = itertools.count(1)


@dataclass
class RankInfo:
    rank: int
    name: str
    pid: int | None = None
    started: float = 0.0
    channel: Channel | None = None
    ready: bool = False
    exit_code: int | None = None
    failure: str | None = None

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.exit_code is None

    def reason(self) -> str:
        text = describe_exit(self.exit_code)
        if self.failure:
            last = self.failure.strip().splitlines()[-1]
            text += f" after: {last}"
        return text


def current() -> Cluster | None:
    """The active cluster of this notebook process, or None."""
    return _current if _current is not None and _current.running else None


def last_spec() -> WorldSpec | None:
    """The settings of the most recently started world (for ``%dist_restart`` after a stop)."""
    return _last


def _runtime() -> str:
    """This process's private runtime directory, made on first use."""
    global _runtime_dir
    if _runtime_dir is None or not os.path.isdir(_runtime_dir):
        _runtime_dir = runtime_dir()
    return _runtime_dir


def _get_template() -> Template:
    global _template
    if _template is None:
        _template = Template(_runtime())
    return _template


def start(n: int, *, name: str = "worker0", worker_name: str = "worker{rank}",
          threads: int | None = None, rpc_timeout: float = 60.0,
          process_group: str | None = None, start_timeout: float = 60.0,
          quiet: bool = False) -> Cluster:
    """Start ``n`` worker ranks and make this process rank 0 of their RPC world."""
    spec = WorldSpec(n, name, worker_name, threads, rpc_timeout, process_group,
                     start_timeout).validate()
    if current() is not None:
        raise ClusterStateError("a world is already running; use `%dist_restart` (or "
                                "`nbdist.current().restart()`) to start a new one, or "
                                "`%dist_stop` first")
    cluster = Cluster(spec)
    cluster._start(quiet=quiet)
    return cluster


def stop() -> None:
    """Stop the active cluster, if any."""
    if _current is not None:
        _current.stop()


class Cluster:
    """A running local world. Use ``nbdist.start`` to make one."""

    def __init__(self, spec: WorldSpec) -> None:
        self.spec = spec
        self.names = spec.names()
        self.ranks: dict[int, RankInfo] = {}
        self.running = False
        self.started_at = time.time()
        self.router = Router()
        self._cv = threading.Condition()
        self._results: dict[int, dict[int, tuple]] = {}
        self._flushed: dict[int, set[int]] = {}
        self._wake_r, self._wake_w = os.pipe()
        self._receiver: threading.Thread | None = None
        self._stopping = False
        self._torn_down = False
        self._world_dir: str | None = None
        self._listener: Listener | None = None
        self._rpc_up = False
        self._pg_up = False
        self.startup_seconds = 0.0
        self.epoch = next(_epochs)

    # ------------------------------------------------------------------ start
    def _start(self, quiet: bool) -> None:
        global _current, _last
        _last = self.spec
        t0 = time.monotonic()
        spec = self.spec
        deadline = t0 + spec.start_timeout
        template = _get_template()
        template.ensure_started()  # imports torch in parallel with us
        import torch.distributed.rpc as rpc

        if not rpc.is_available():
            raise StartError("this torch build has no torch.distributed.rpc; install a build "
                             "with distributed support")
        try:
            self._world_dir = tempfile.mkdtemp(prefix="w", dir=_runtime())
            key = os.urandom(32)
            self._listener = Listener(os.path.join(self._world_dir, "ctl"), key)
            template.on_exit = self._on_exit
            template.wait_ready(deadline)
            configs = [self._config(r, key) for r in range(1, spec.n + 1)]
            now = time.time()
            for r, nm in enumerate(self.names):
                self.ranks[r] = RankInfo(r, nm, started=now)
            self.ranks[0].pid = os.getpid()
            self.ranks[0].ready = True
            for rank, pid in template.spawn(configs, deadline).items():
                self.ranks[rank].pid = pid
            self._accept_all(deadline)
            self._receiver = threading.Thread(target=self._receive, daemon=True,
                                              name="nbdist-receiver")
            self._receiver.start()
            _current = self
            self.running = True
            rpc_hooks.set_death_check(self._check_dest, self._interrupt_dest)
            self._join_as_rank0(deadline)
            self._wait_ready(deadline)
            self._ping_all(deadline)
        except BaseException as exc:
            self._teardown()
            if isinstance(exc, (StartError, DistTimeoutError, KeyboardInterrupt)):
                raise
            raise StartError(f"could not start the world: {exc}") from exc
        self.startup_seconds = time.monotonic() - t0
        records._set_identity(0, self.names[0])
        if not quiet:
            print(f"nbdist: {spec.world_size} ranks ready in {self.startup_seconds:.2f}s: "
                  + ", ".join(f"{r}={nm}" for r, nm in enumerate(self.names)))

    def _config(self, rank: int, key: bytes) -> dict:
        spec = self.spec
        env = dict(os.environ)
        env.update(spec.env)
        threads = spec.thread_count()
        env.update({"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo",
                    "OMP_NUM_THREADS": str(threads), "NBDIST_RANK": str(rank),
                    "NBDIST_WORLD_SIZE": str(spec.world_size)})
        assert self._world_dir is not None and self._listener is not None
        return {
            "rank": rank, "name": self.names[rank], "world_size": spec.world_size,
            "socket": self._listener.path, "authkey": key, "cwd": os.getcwd(),
            "env": env, "path": list(sys.path), "threads": threads,
            "rpc_init": f"file://{self._world_dir}/rpc", "rpc_timeout": spec.rpc_timeout,
            "rpc_threads": 16, "process_group": spec.process_group,
            "pg_init": f"file://{self._world_dir}/pg", "pg_timeout": spec.rpc_timeout,
            "start_timeout": spec.start_timeout, "epoch": self.epoch,
        }

    def _accept_all(self, deadline: float) -> None:
        assert self._listener is not None
        missing = set(range(1, self.spec.n + 1))
        while missing:
            self._raise_if_dead(missing, "connecting to the notebook")
            if time.monotonic() > deadline:
                raise DistTimeoutError(self._waiting_msg(missing, "connect to the notebook"))
            try:
                chan = self._listener.accept(0.1)
            except DistTimeoutError:
                continue
            if not chan.poll(max(deadline - time.monotonic(), 0.01)):
                chan.close()
                continue
            kind, rank, _pid = chan.recv()
            self.ranks[rank].channel = chan
            missing.discard(rank)

    def _join_as_rank0(self, deadline: float) -> None:
        import torch.distributed as dist
        import torch.distributed.rpc as rpc

        spec = self.spec
        rpc_hooks.reset_world_state()
        quiet.install()
        if not rref_reset.reset_singleton() and self.epoch > 1:
            Router._write("stderr", "nbdist: this torch build hides its RRef context, so RRefs "
                                    "in this notebook may fail after a restart; restart the "
                                    "kernel if they do\n")
        shipping.install()
        rpc_hooks.install_callee()
        rpc_hooks.install_caller()
        rpc_hooks.quiet_warnings()
        from ..telemetry import tracing

        tracing.install(0, self.names[0])
        opts = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{self._world_dir}/rpc",
                                               rpc_timeout=spec.rpc_timeout)
        with _loopback_env():
            self._in_thread(lambda: rpc.init_rpc(self.names[0], rank=0,
                                                 world_size=spec.world_size,
                                                 rpc_backend_options=opts),
                            deadline, "join the RPC world (init_rpc)")
            self._rpc_up = True
            shipping.register_patched("torch.distributed.rpc", "torch.distributed.rpc.api")
            if spec.process_group:
                from datetime import timedelta

                self._in_thread(lambda: dist.init_process_group(
                    spec.process_group, init_method=f"file://{self._world_dir}/pg", rank=0,
                    world_size=spec.world_size, timeout=timedelta(seconds=spec.rpc_timeout)),
                    deadline, "join the process group")
                self._pg_up = True

    def _in_thread(self, fn: Any, deadline: float, what: str) -> None:
        """Run a blocking torch call in a thread while watching the workers and the clock."""
        box: dict = {}

        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc
            box["done"] = True

        t = threading.Thread(target=target, daemon=True, name="nbdist-join")
        t.start()
        workers = set(range(1, self.spec.n + 1))
        while not box.get("done"):
            t.join(0.05)
            if box.get("done"):
                break
            self._raise_if_dead(workers, what)
            if time.monotonic() > deadline:
                raise DistTimeoutError(f"rank 0 ({self.names[0]}) timed out waiting to {what}")
        if "error" in box:
            raise box["error"]

    def _wait_ready(self, deadline: float) -> None:
        with self._cv:
            while True:
                missing = {r for r, i in self.ranks.items() if not i.ready}
                if not missing:
                    return
                self._raise_if_dead(missing, "joining the RPC world")
                if time.monotonic() > deadline:
                    raise DistTimeoutError(self._waiting_msg(missing, "join the RPC world"))
                self._cv.wait(0.05)

    def _ping_all(self, deadline: float) -> None:
        import torch.distributed.rpc as rpc

        futs = {r: rpc.rpc_async(self.names[r], os.getpid) for r in range(1, self.spec.n + 1)}
        for r, fut in futs.items():
            while not fut.done():
                self._raise_if_dead({r}, "answering its first RPC")
                if time.monotonic() > deadline:
                    raise DistTimeoutError(self._waiting_msg({r}, "answer its first RPC"))
                time.sleep(0.002)
            fut.wait()

    def _waiting_msg(self, ranks: set[int], what: str) -> str:
        who = ", ".join(f"rank {r} ({self.names[r]})" for r in sorted(ranks))
        return f"timed out after {self.spec.start_timeout:g}s waiting for {who} to {what}"

    def _raise_if_dead(self, ranks: set[int], what: str) -> None:
        for r in sorted(ranks):
            info = self.ranks.get(r)
            if info is not None and info.exit_code is not None:
                detail = f"\n\nits traceback:\n{info.failure}" if info.failure else ""
                raise WorkerDiedError(r, info.name, info.reason(), what) if not detail else \
                    StartError(f"rank {r} ({info.name}) failed while {what}: "
                               f"{describe_exit(info.exit_code)}{detail}")

    # ------------------------------------------------------------------ receiving
    def _receive(self) -> None:
        """One thread reads every worker channel and routes what arrives."""
        while True:
            chans = {i.channel: i for i in self.ranks.values() if i.channel is not None}
            if self._stopping and not chans:
                return
            try:
                ready = wait_any([self._wake_r, *[c.conn for c in chans]], timeout=0.2)
            except OSError:
                ready = []
            if not ready:
                self.router.flush()
                continue
            by_conn = {c.conn: (c, i) for c, i in chans.items()}
            for conn in ready:
                if conn == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                chan, info = by_conn[conn]
                try:
                    msg = chan.recv()
                except (EOFError, OSError):
                    self._lost(info)
                    continue
                self._dispatch(info, msg)
            if self._stopping and all(i.channel is None for i in self.ranks.values()):
                return

    def _dispatch(self, info: RankInfo, msg: tuple) -> None:
        kind = msg[0]
        if kind == "out":
            self.router.feed(info.rank, info.name, msg[2], msg[3])
        elif kind == "metrics":
            records._deliver(msg[2])
        elif kind == "result":
            self.router.flush(info.rank)
            with self._cv:
                self._results.setdefault(msg[2], {})[info.rank] = msg[3:]
                self._cv.notify_all()
        elif kind == "flushed":
            with self._cv:
                self._flushed.setdefault(msg[2], set()).add(info.rank)
                self._cv.notify_all()
        elif kind == "ready":
            with self._cv:
                info.ready = True
                self._cv.notify_all()
        elif kind == "failed":
            with self._cv:
                info.failure = msg[2]
                self._cv.notify_all()

    def _lost(self, info: RankInfo) -> None:
        """The worker's channel closed: it exited or is about to; the template says how.

        No waiting here: this thread carries every other rank's output, and ``_on_exit``
        (from the template's reader) records the exit status and wakes any waiter.
        """
        if info.channel is not None:
            info.channel.close()
            info.channel = None

    def _on_exit(self, pid: int, code: int) -> None:
        for info in self.ranks.values():
            if info.pid == pid and info.rank != 0:
                with self._cv:
                    info.exit_code = code
                    self._cv.notify_all()
                if not self._stopping and self.running:
                    self.router.flush(info.rank)
                    Router._write("stderr", f"nbdist: rank {info.rank} ({info.name}) "
                                            f"{info.reason()}\n")
                return

    def _check_dest(self, dest: Any) -> None:
        """Death check for waits on RPCs: raise if ``dest`` is a dead rank of this world."""
        rank = self._rank_of(dest)
        if rank is not None:
            info = self.ranks[rank]
            if info.exit_code is not None:
                raise WorkerDiedError(rank, info.name, info.reason(), "an RPC waited on it")

    def _interrupt_dest(self, dest: Any) -> None:
        """Ctrl-C stopped a wait on ``dest``: interrupt the RPC work running there too."""
        rank = self._rank_of(dest)
        if rank:
            self.interrupt([rank])

    def _rank_of(self, dest: Any) -> int | None:
        if isinstance(dest, int):
            return dest if dest in self.ranks else None
        name = getattr(dest, "name", dest)
        for r, nm in enumerate(self.names):
            if nm == name:
                return r
        return None

    # ------------------------------------------------------------------ running cells
    def run(self, code: str, ranks: Any = None, timeout: float | None = None,
            show: bool = True) -> dict[int, str | None]:
        """Run ``code`` on worker ranks; returns rank -> repr of the last expression.

        Output streams into the current cell as it is printed; the last expression of each
        rank is printed as ``[name] value`` when ``show``. Raises ``DistCellError`` naming
        every rank that failed, after the others' output was shown.
        """
        targets = parse_ranks(ranks, self.names)
        exec_id = self.send_cell(code, targets)
        results = self.collect(exec_id, targets, timeout)
        return self.report(results, targets, show)

    def send_cell(self, code: str, targets: list[int]) -> int:
        """Hand a cell to the targets without waiting; returns the id ``collect`` takes."""
        self._require_running()
        dead = [r for r in targets if not self.ranks[r].alive]
        if dead:
            raise WorkerDiedError(dead[0], self.names[dead[0]], self.ranks[dead[0]].reason(),
                                  "asked to run a cell; `%dist_restart` starts a fresh world")
        exec_id = next(_exec_ids)
        filename = f"<dist-cell-{exec_id}>"
        for r in targets:
            chan = self.ranks[r].channel
            if chan is not None:
                chan.send(("exec", exec_id, code, filename))
        return exec_id

    def collect(self, exec_id: int, targets: list[int], timeout: float | None) -> dict:
        """Wait for a cell's results; interrupts and deaths are handled, never hangs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return self._wait_results(exec_id, targets, deadline)
        except KeyboardInterrupt:
            self.interrupt(self._pending(exec_id, targets))
            try:  # a moment for the workers to report; the notebook comes back regardless
                self._wait_results(exec_id, targets, time.monotonic() + 0.5)
            except (DistTimeoutError, KeyboardInterrupt):
                pass
            raise
        finally:
            with self._cv:
                self._results.pop(exec_id, None)

    def _pending(self, exec_id: int, targets: list[int]) -> list[int]:
        got = self._results.get(exec_id, {})
        return [r for r in targets if r not in got and self.ranks[r].alive]

    def _wait_results(self, exec_id: int, targets: list[int], deadline: float | None) -> dict:
        with self._cv:
            while True:
                pending = self._pending(exec_id, targets)
                if not pending:
                    got = dict(self._results.get(exec_id, {}))
                    for r in targets:
                        if r not in got:
                            got[r] = ("died", self.ranks[r].reason())
                    return got
                if deadline is not None and time.monotonic() > deadline:
                    self.interrupt(pending)
                    who = ", ".join(f"rank {r} ({self.names[r]})" for r in pending)
                    raise DistTimeoutError(f"timed out waiting for {who} to finish the cell; "
                                           "they were interrupted")
                self._cv.wait(0.05)

    def report(self, results: dict, targets: list[int], show: bool = True) -> dict[int, str | None]:
        values: dict[int, str | None] = {}
        failures: list[RankFailure] = []
        for r in targets:
            res = results[r]
            nm = self.names[r]
            if res[0] == "ok":
                values[r] = res[1]
                if show and res[1] is not None:
                    body = res[1].replace("\n", f"\n[{nm}] ")
                    print(f"[{nm}] {body}")
            elif res[0] == "error":
                failures.append(RankFailure(r, nm, res[1], res[2], res[3]))
            else:
                failures.append(RankFailure(r, nm, "WorkerDiedError", res[1], f"rank {r} "
                                            f"({nm}) {res[1]} while running the cell\n"))
        if failures:
            ranks = ", ".join(f"{f.rank} ({f.name})" for f in failures)
            plural = "s" if len(failures) > 1 else ""
            raise DistCellError(failures, f"the cell failed on rank{plural} {ranks}: ")
        return values

    def interrupt(self, ranks: Any = None) -> None:
        """Send KeyboardInterrupt to the cell and RPC functions running on workers."""
        targets = parse_ranks(ranks, self.names) if ranks is not None else list(
            range(1, self.spec.n + 1))
        for r in targets:
            chan = self.ranks[r].channel
            if chan is not None and self.ranks[r].alive:
                try:
                    chan.send(("interrupt",))
                except OSError:
                    pass

    def flush(self, timeout: float = 2.0) -> bool:
        """Wait until everything workers printed or logged so far has reached the notebook.

        Output and metrics travel on the control channel while RPC results travel on
        TensorPipe, so right after an RPC returns its last lines may still be in flight;
        after ``flush()`` they have been shown and ``nbdist.history()`` has them.
        Returns False if some live worker did not answer in time.
        """
        if not self.running:
            return True
        token = next(_exec_ids)
        targets = [r for r, i in self.ranks.items() if r and i.alive and i.channel is not None]
        for r in targets:
            try:
                self.ranks[r].channel.send(("flush", token))  # type: ignore[union-attr]
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        with self._cv:
            try:
                while True:
                    done = self._flushed.get(token, set())
                    waiting = [r for r in targets if r not in done and self.ranks[r].alive]
                    if not waiting:
                        break
                    if time.monotonic() > deadline:
                        return False
                    self._cv.wait(0.02)
            finally:
                self._flushed.pop(token, None)
        self.router.flush()
        return True

    # ------------------------------------------------------------------ status
    def status(self) -> StatusTable:
        """A table of every rank: pid, alive or how it died, CPU %, memory, uptime."""
        return collect_status(self)

    def worker_pids(self) -> list[int]:
        return [i.pid for r, i in self.ranks.items() if r != 0 and i.pid is not None]

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def _require_running(self) -> None:
        if not self.running:
            raise ClusterStateError("this world was stopped; start one with `%dist_start N`")

    # ------------------------------------------------------------------ stop / restart
    def stop(self, timeout: float = 5.0) -> None:
        """Stop every worker and leave RPC in this process ready for a new world."""
        global _current
        if self._torn_down:
            return
        if self.running and threading.current_thread() is not self._receiver:
            self.flush(timeout=min(timeout, 1.0))  # the last RPC's output is still shown
        self.running = False
        try:
            self._teardown(timeout)
        finally:
            if _current is self:
                _current = None

    def restart(self, n: int | None = None, *, quiet: bool = False, **changes: Any) -> Cluster:
        """Stop this world and start a new one; unspecified settings stay as they were."""
        spec = self.spec.with_changes(n=n, **changes).validate()
        self.stop()
        cluster = Cluster(spec)
        cluster._start(quiet=quiet)
        return cluster

    def _teardown(self, timeout: float = 5.0) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        self._stopping = True
        self.router.muted = True
        rpc_hooks.set_death_check(None)
        self._shutdown_rank0()  # first, so no rank-0 agent complains about vanished peers
        for info in self.ranks.values():
            if info.channel is not None and info.alive:
                try:
                    info.channel.send(("stop",))
                except OSError:
                    pass
        pids = [i.pid for r, i in self.ranks.items() if r != 0 and i.alive and i.pid]
        deadline = time.monotonic() + timeout
        template_up = _template is not None and _template.alive()
        with self._cv:
            while any(self.ranks[r].alive for r in self.ranks if r != 0):
                if not template_up:  # no one will report exits: look for ourselves
                    for r, info in self.ranks.items():
                        if r and info.alive and not pid_alive(info.pid):  # type: ignore[arg-type]
                            info.exit_code = -signal.SIGKILL
                    if not any(self.ranks[r].alive for r in self.ranks if r != 0):
                        break
                if time.monotonic() > deadline - timeout / 2 and pids:
                    _get_template().kill(pids, signal.SIGKILL)
                    pids = []
                if time.monotonic() > deadline:
                    break
                self._cv.wait(0.02)
        for info in self.ranks.values():
            if info.channel is not None:
                info.channel.close()
                info.channel = None
        os.write(self._wake_w, b"x")
        if self._receiver is not None and self._receiver is not threading.current_thread():
            self._receiver.join(2.0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._listener is not None:
            self._listener.close()
        if self._world_dir is not None:
            shutil.rmtree(self._world_dir, ignore_errors=True)
        self.running = False

    def _shutdown_rank0(self) -> None:
        import torch.distributed as dist
        import torch.distributed.rpc as rpc

        if self._pg_up:
            try:
                dist.destroy_process_group()
            except Exception:
                pass
            self._pg_up = False
        if self._rpc_up:
            try:
                rpc.shutdown(graceful=False)
            except Exception:
                pass
            self._rpc_up = False
        rpc_hooks.reset_world_state()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<nbdist.Cluster {state}: " + ", ".join(
            f"{r}={nm}" for r, nm in enumerate(self.names)) + ">"


class _loopback_env:
    """Make torch's TensorPipe and Gloo listen on loopback only while rank 0 joins."""

    KEYS = {"TP_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.KEYS}
        os.environ.update(self.KEYS)

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _at_exit() -> None:
    """Interpreter exit: files first (the fastest, and what a kill would leave), then workers.

    Quick on purpose: Jupyter gives a kernel a few seconds to exit before it kills it.
    """
    if _runtime_dir is not None:
        shutil.rmtree(_runtime_dir, ignore_errors=True)
    try:
        if _template is not None:
            _template.close(timeout=2.0)  # the template SIGKILLs every worker it forked
    finally:
        if _current is not None:
            _current.stop(timeout=1.0)


atexit.register(_at_exit)
