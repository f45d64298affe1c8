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

from .channel import Channel
from .protocol import Exit, Exited, Kill, ProtocolError, Spawn, Spawned, TemplateReady

__all__ = ["main"]


def _preload() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.autograd  # noqa: F401
    import torch.distributed.rpc  # noqa: F401

    from ..patches import rpc_hooks, rref_reset, shipping  # noqa: F401
    from ..telemetry import records, tracing  # noqa: F401
    from . import shell, worker  # noqa: F401

    rpc_hooks.quiet_warnings()  # children inherit the import hook
    rref_reset.available()  # parses libtorch's symbol table once; children inherit the result
    shell.preload()  # each worker's IPython shell, made once (~30 ms) before any fork

    warnings.resetwarnings()


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ipykernel repeats it; clean up once
    raise SystemExit(0)  # unwinds into main's cleanup: children killed, directory removed


def main(fd: int, runtime_dir: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)  # ipykernel SIGTERMs its children at shutdown
    chan = Channel(socket.socket(fileno=fd), threaded=False, name="notebook")
    _preload()
    chan.send(TemplateReady(os.getpid()))
    children: dict[int, int] = {}
    idle_limit = float(os.environ.get("NBDIST_TEMPLATE_IDLE", "600"))
    idle_since = time.monotonic()
    try:
        while True:
            try:
                msg = chan.recv() if chan.poll(0.05) else None
            except ProtocolError:
                continue  # a frame we cannot read: the next one may be fine
            except (EOFError, OSError):
                break
            if isinstance(msg, Spawn):
                pid = _fork_worker(chan, msg.config)
                children[pid] = msg.config["rank"]
                chan.send(Spawned(msg.config["rank"], pid))
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
                chan.send(Exited(pid, os.waitstatus_to_exitcode(status)))
            if children:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle_limit:
                break
    finally:
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
        shutil.rmtree(runtime_dir, ignore_errors=True)
        os._exit(0)


def _fork_worker(chan: Channel, config: dict) -> int:
    """Fork; the child becomes the worker and never returns here, whatever happens."""
    pid = os.fork()
    if pid:
        return pid
    try:
        chan.sock.close()
        from .worker import run_forked

        run_forked(config)
    finally:
        os._exit(1)  # only reached if the worker's own exit failed


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
