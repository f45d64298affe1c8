"""The warm template process: imports torch once, then forks worker ranks on request.

Started by ``launch.Template`` as ``python -m nbdist.proc.template FD``. It stays single-threaded so
``fork`` is safe, ignores SIGINT (interrupts are for the workers), reports every child's exit
status, and when the notebook goes away (its end of the socket closes) it kills its children,
removes its runtime directory and exits. It also exits on its own after being idle (no
children) for ``NBDIST_TEMPLATE_IDLE`` seconds (default 600).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from ..control.channel import Channel
from ..control.protocol import (
    Exit,
    Exited,
    Heartbeat,
    Kill,
    ProtocolError,
    Relay,
    Spawn,
    Spawned,
    TemplateReady,
)
from ..fd_wait import readable
from ..rank_config import RankConfig
from .procstat import Sampler

__all__ = ["main", "preload", "serve"]


def preload() -> None:
    """Import what every worker needs, once, before any fork."""
    import warnings

    warnings.filterwarnings("ignore")
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.autograd  # noqa: F401
    import torch.distributed.rpc  # noqa: F401

    from ..patches import quiet, rpc_hooks, rpc_rerun, rref_reset, torch_private  # noqa: F401
    from ..shipping import pickler  # noqa: F401
    from ..telemetry import records, tracing  # noqa: F401
    from . import shell, worker  # noqa: F401

    quiet.hide_warnings()  # children inherit the import hook
    rref_reset.available()  # parses libtorch's symbol table once; children inherit the result
    torch_private.problems()  # every private name looked up once, here, not in each worker
    shell.preload()  # each worker's IPython shell, made once (~30 ms) before any fork
    rpc_rerun.install()  # a cell's own init_rpc runs again as in a fresh process

    warnings.resetwarnings()


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ipykernel repeats it; clean up once
    raise SystemExit(0)  # unwinds into main's cleanup: children killed, directory removed


def main(fd: int, runtime_dir: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)  # ipykernel SIGTERMs its children at shutdown
    chan = Channel(socket.socket(fileno=fd), threaded=False, name="notebook")
    preload()
    chan.send(TemplateReady(os.getpid()))
    try:
        serve(chan)
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
        os._exit(0)


def serve(chan: Channel, prepare: Callable[[RankConfig], RankConfig] | None = None,
          heartbeat: float | None = None, silence: float | None = None,
          relay: Any = None) -> None:
    """Fork workers on ``Spawn``, signal them on ``Kill``, report each exit, until ``Exit``,
    the notebook's end closing, or ``NBDIST_TEMPLATE_IDLE`` seconds without workers; then
    SIGKILL every child. Shared with the join agent, which also passes ``prepare`` (adapt a
    config to this host), ``heartbeat`` (send one every so many seconds) and ``silence``
    (a notebook quiet this long is gone) and ``relay`` (a ``hosts.rank_pipes.RankPipes``: each
    rank forked with a pipe to it, ``Relay`` frames handed on through them)."""
    children: dict[int, int] = {}
    gate = _Gate()
    sampler = Sampler()  # the ranks' CPU and memory, for heartbeats
    idle_limit = float(os.environ.get("NBDIST_TEMPLATE_IDLE", "600"))
    idle_since = last_heard = last_beat = time.monotonic()
    try:
        while True:
            try:
                msg = chan.recv() if _wait(chan, relay) else None
            except ProtocolError:
                continue  # a frame we cannot read: the next one may be fine
            except (EOFError, OSError):
                break
            now = time.monotonic()
            if msg is not None:
                last_heard = now
            elif silence is not None and now - last_heard > silence:
                break
            if heartbeat is not None and now - last_beat >= heartbeat:
                chan.send(_beat(children, sampler))
                last_beat = now
            if not isinstance(msg, Spawn):
                gate.release()  # whatever else came (a heartbeat, a relay) ends the batch
            if isinstance(msg, Relay) and relay is not None:
                relay.forward(msg)
            elif isinstance(msg, Spawn):
                config = prepare(msg.config) if prepare else msg.config
                gate.open()
                pid = _fork_worker(chan, config, gate, relay)
                children[pid] = config.rank
                chan.send(Spawned(config.rank, pid))
                if not chan.poll(0):  # no more Spawn waiting: the batch is forked
                    gate.release()
            elif isinstance(msg, Kill):
                for pid in msg.pids:
                    if pid in children:  # forked by us and not reaped: cannot be reused
                        try:
                            os.kill(pid, msg.signal)
                        except ProcessLookupError:
                            pass
            elif isinstance(msg, Exit):
                break
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.pop(pid, None)
                if relay is not None:
                    relay.exited(pid, chan)  # what it sent last goes before its exit
                chan.send(Exited(pid, os.waitstatus_to_exitcode(status)))
            if relay is not None:
                relay.flush(chan)
            if children:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_limit:
                break
    finally:
        gate.release()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _beat(children: dict[int, int], sampler: Sampler) -> Heartbeat:
    """This host's load average and available memory (``%dist_status --hosts``), and each
    rank's CPU % and memory (``%dist_status``)."""
    try:
        import psutil

        mem = psutil.virtual_memory().available / 2**20
    except Exception:  # noqa: BLE001
        mem = 0.0
    sampler.keep_only(children)
    ranks = tuple((rank, pid, *sampler.sample(pid)) for pid, rank in children.items())
    return Heartbeat(os.getloadavg()[0], mem, ranks)


class _Gate:
    """Holds the workers of one batch of forks until the last is forked: a child that started
    its work at once would take the CPU from the forks still to come (on a machine with fewer
    cores than ranks the template then forked 127 workers in 4.8 s instead of about 1 s).
    A pipe: each child waits for its end of file, which ``release`` gives them all at once."""

    def __init__(self) -> None:
        self.read_fd: int | None = None
        self.write_fd: int | None = None

    def open(self) -> None:
        """A new batch, unless one is open."""
        if self.write_fd is None:
            self.read_fd, self.write_fd = os.pipe()

    def wait(self) -> None:
        """In a forked child: until the batch is released (or the template is gone)."""
        if self.write_fd is not None:
            os.close(self.write_fd)
        if self.read_fd is not None:
            try:
                os.read(self.read_fd, 1)
            finally:
                os.close(self.read_fd)

    def release(self) -> None:
        """Let every child of the batch go."""
        for fd in (self.write_fd, self.read_fd):
            if fd is not None:
                os.close(fd)
        self.read_fd = self.write_fd = None


def _wait(chan: Channel, relay: Any) -> bool:
    """Wait (50 ms at most) for a frame from the notebook; meanwhile take the ranks' frames
    into the relay's batch. True when the notebook's frame (or its end) is there."""
    if relay is None:
        return chan.poll(0.05)
    due = relay.due_in(time.monotonic())
    wait = 0.05 if due is None else min(0.05, due)
    try:
        ready = readable([chan.fileno(), *relay.fds()], wait)
    except (OSError, ValueError):  # a pipe closed under us: look again
        return False
    for fd in ready:
        if fd != chan.fileno():
            relay.read(fd)
    return chan.fileno() in ready


def _fork_worker(chan: Channel, config: RankConfig, gate: _Gate, relay: Any = None) -> int:
    """Fork; the child becomes the worker and never returns here, whatever happens."""
    relay_fd = relay.before_fork() if relay is not None else None
    pid = os.fork()
    if pid:
        if relay is not None:
            relay.forked(config.rank, pid)
        return pid
    try:
        gate.wait()
        chan.sock.close()
        if relay is not None:
            relay.in_child()
        if config.affinity:  # its share of the host's CPUs (hosts.join_agent)
            os.sched_setaffinity(0, config.affinity)
        from .worker import run_forked

        run_forked(config, relay_fd)
    finally:
        os._exit(1)  # only reached if the worker's own exit failed


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
