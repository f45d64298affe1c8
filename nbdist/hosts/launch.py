"""How worker processes are started, watched and killed, seen from the notebook.

``Template`` owns the warm template process (``nbdist.proc.template``): it starts it, asks it to
fork workers, learns their exit statuses from it, and can signal them through it. The template
outlives single worlds so a restart does not pay for ``import torch`` again.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from ..control.channel import Channel
from ..control.protocol import (
    Exit,
    Exited,
    Kill,
    Message,
    ProtocolError,
    Spawn,
    Spawned,
    TemplateReady,
)
from ..errors import DistTimeoutError, StartError
from ..rank_config import RankConfig
from ..rank_info import describe_exit

__all__ = ["IMPORT_TIME_ENV", "ForkClient", "Launcher", "Template", "import_time_env"]

#: Prefixes of environment variables that torch, OpenMP or a BLAS read when torch is imported
#: (``TORCH_LOGS``, ``OMP_NUM_THREADS``, ...): workers forked from a template share its import,
#: so a template started before one of them changed must be started again. ``KMP_`` counts
#: only where torch's OpenMP runtime reads it (``import_time_env``).
IMPORT_TIME_ENV = ("TORCH_", "PYTORCH_", "OMP_", "GOMP_", "MKL_", "OPENBLAS_", "GLOG_")
#: Read by LLVM's and Intel's OpenMP runtimes (not GNU's, which pip's Linux torch ships)...
_KMP = "KMP_"
#: ...but never worth a fresh template: ``import sklearn`` sets both. One is read when a second
#: OpenMP runtime loads (in a worker, after the fork, from its own environment); the other
#: would stop the runtime re-initialising in forked children, which workers need.
_KMP_NOT_AT_IMPORT = frozenset({"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"})


@functools.lru_cache(maxsize=1)
def _torch_reads_kmp() -> bool:
    """Whether torch's OpenMP runtime reads ``KMP_*``: unless torch ships GNU's libgomp (found
    beside torch's libraries, without importing torch), assume it does."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return True
    try:
        libs = os.listdir(os.path.join(os.path.dirname(spec.origin), "lib"))
    except OSError:
        return True
    return not any(name.startswith("libgomp") for name in libs)


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that count at ``import torch`` (``IMPORT_TIME_ENV``, and
    ``KMP_*`` where torch's OpenMP reads them at import)."""
    kmp = _torch_reads_kmp()
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) or (
        kmp and k.startswith(_KMP) and k not in _KMP_NOT_AT_IMPORT)}


@runtime_checkable
class Launcher(Protocol):
    """What forks a world's workers and watches them, seen from the notebook: ``Template`` on
    this machine, ``hosts.HostAgent`` on another (as jupyter_client's kernel provisioners sit
    behind one interface). ``on_exit(pid, code)`` is told of each worker it reaped."""

    on_exit: Callable[[int, int], None] | None

    @property
    def pid(self) -> int | None:
        """The launcher's own process, while it runs."""

    def alive(self) -> bool:
        """Whether it runs and answers (a dead launcher's workers are dead too)."""

    def spawn(self, configs: list[RankConfig], deadline: float) -> dict[int, int]:
        """Fork one worker per config (``cluster.startup.worker_config``); rank -> pid."""

    def kill(self, pids: list[int], sig: int = signal.SIGKILL) -> None:
        """Signal workers it forked and has not reaped (never a reused pid)."""

    def close(self, timeout: float = 5.0) -> None:
        """End it and with it every worker it forked."""


class ForkClient:
    """The notebook's side of a process that forks workers on request over a ``Channel``
    (``spawn``, ``kill``, ``close``; exits reported to ``on_exit``): what ``Template`` and
    ``hosts.HostAgent`` share. How that process starts and is read is theirs."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.conn: Channel | None = None
        self.on_exit: Callable[[int, int], None] | None = None
        self._spawned: dict[int, int] = {}  # rank -> pid, for the spawn in progress
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self._spawn_cv = threading.Condition()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, TemplateReady):
            self._ready.set()
        elif isinstance(msg, Spawned):
            with self._spawn_cv:
                self._spawned[msg.rank] = msg.pid
                self._spawn_cv.notify_all()
        elif isinstance(msg, Exited) and self.on_exit is not None:
            self.on_exit(msg.pid, msg.code)

    # -- requests ---------------------------------------------------------------------------
    def _send(self, msg: Message) -> None:
        conn = self.conn
        if conn is None:
            raise StartError("the worker template process is not running")
        conn.send(msg)

    def spawn(self, configs: list[RankConfig], deadline: float) -> dict[int, int]:
        """Fork one worker per config; returns rank -> pid."""
        with self._spawn_cv:
            self._spawned = {}
        for cfg in configs:
            self._send(Spawn(cfg))
        want = {c.rank for c in configs}
        with self._spawn_cv:
            while not want <= set(self._spawned):
                if not self.alive():
                    raise StartError("the worker template process died while forking workers")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistTimeoutError("timed out waiting for the template to fork workers")
                self._spawn_cv.wait(min(left, 0.1))
            return dict(self._spawned)

    def kill(self, pids: list[int], sig: int = signal.SIGKILL) -> None:
        """Signal workers through the template, which only signals children it has not reaped
        (so a reused pid is never hit). Without a template there is nothing to do: its
        children got SIGKILL when it died (``PR_SET_PDEATHSIG``)."""
        try:
            self._send(Kill(tuple(pids), int(sig)))
        except (OSError, StartError):
            pass

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def close(self, timeout: float = 5.0) -> None:
        """Stop the template and with it every worker it forked."""
        proc, conn, reader = self.proc, self.conn, self._reader
        self.proc = self.conn = self._reader = None
        if conn is not None:
            try:
                conn.send(Exit())
                conn.drain(timeout)
            except OSError:
                pass
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # SIGTERM first: a launcher such as srun still queued then cancels its job
                # (after SIGKILL the job stays queued, starts later and is killed there)
                proc.terminate()
                try:
                    proc.wait(min(timeout, 2.0))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
        if reader is not None:
            reader.join(timeout)  # sees EOF once the template is gone; then the fd is ours
        if conn is not None:
            conn.close()


class Template(ForkClient):
    """Client side of one warm template process."""

    def __init__(self, runtime_dir: str) -> None:
        super().__init__()
        self.runtime_dir = runtime_dir
        self.started_env: dict[str, str] = {}  # import_time_env of the running template

    def ensure_started(self) -> None:
        """Start the template if it is not running (returns at once; ``wait_ready`` waits)."""
        if self.alive():
            return
        self.close()
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.started_env = import_time_env(env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nbdist.proc.template", str(theirs.fileno()), self.runtime_dir],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env=env, close_fds=True,
        )
        theirs.close()
        self.conn = Channel(ours, name="the template process")
        self._ready.clear()
        self._reader = threading.Thread(target=self._read_loop, args=(self.conn, self.proc),
                                        name="nbdist-template-reader", daemon=True)
        self._reader.start()

    def env_changed(self) -> list[str]:
        """Import-time variables (``IMPORT_TIME_ENV``) that differ in this process's
        environment now from the one the running template imported torch with."""
        if not self.alive():
            return []
        now = import_time_env(os.environ)
        return sorted(k for k in now.keys() | self.started_env.keys()
                      if now.get(k) != self.started_env.get(k))

    def wait_ready(self, deadline: float) -> None:
        while not self._ready.wait(0.05):
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise StartError(f"the worker template process {describe_exit(code)} while "
                                 "importing torch; run `python -c 'import torch.distributed.rpc'` "
                                 "to see why")
            if time.monotonic() > deadline:
                raise DistTimeoutError("timed out waiting for the worker template process to "
                                       "import torch")

    def _read_loop(self, conn: Channel, proc: subprocess.Popen) -> None:
        while True:
            try:
                msg = conn.recv()
            except ProtocolError:
                continue
            except (EOFError, OSError):
                self._ready.clear()
                try:  # reap it now: a zombie child makes ipykernel's shutdown wait for it
                    proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    pass
                return
            self._dispatch(msg)
