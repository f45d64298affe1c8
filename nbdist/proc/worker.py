"""What runs inside a worker rank, from the fork in the template to ``os._exit``.

Start-up: die with the template, take the notebook's cwd/env/sys.path, connect to the control
socket, capture output, take its GPU (if it has one), join the RPC world (and the process
group, if asked), say ready.
Then the main thread runs ``%%dist`` cells from a queue while a reader thread handles
interrupts and stop requests at once, even while a cell runs.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import safe_str
from ..patches import quiet, rpc_hooks, rpc_rerun
from . import comms, cuda, membership, shell
from .channel import Channel, ChannelBlocked, connect
from .debugger import Debugger
from .output import ChannelStream, capture_fds
from .protocol import (
    CommClose,
    CommMsg,
    Debug,
    DebugInput,
    Exec,
    Failed,
    Flush,
    Flushed,
    Hello,
    Interrupt,
    Metrics,
    Output,
    ProtocolError,
    Ready,
    Rejoin,
    Result,
    Stop,
)
from .rank_config import RankConfig

__all__ = ["run_forked", "current_channel"]

_channel: Channel | None = None
_cfg: RankConfig | None = None  # this worker's config; each ``Rejoin`` brings a new world's
_rejoining = threading.Lock()  # held while a rejoin thread leaves one world for the next
_debugger: Debugger = None  # type: ignore[assignment] - set at start-up
_executing = False
_queued = 0  # the id of the last cell handed to the main thread
_cancelled = 0  # cells up to this id were interrupted: one not begun yet does not run
_rank = -1
#: how often, and how long apart, an interrupt is signalled again while the cell it stops runs
#: on with no KeyboardInterrupt raised into it (one that Python swallowed, see ``_CellRun``)
_RESIGNAL_TRIES, _RESIGNAL_AFTER = 5, 0.3


class _CellRun:
    """The cell the main thread runs (0: none) and the last one a KeyboardInterrupt was raised
    into; a KeyboardInterrupt that Python swallows (raised in a finalizer, or in IPython's
    event hooks) is forgotten here, so the interrupt is signalled again."""

    def __init__(self) -> None:
        self.running = 0
        self.raised = 0


_CELL_RUN = _CellRun()


def current_channel() -> Channel | None:
    """The control channel of this worker (None on the notebook)."""
    return _channel


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _on_sigint(signum: int, frame: Any) -> None:
    rpc_hooks.interrupt_rpc_threads()
    if _executing:
        _CELL_RUN.raised = 0 if _in_event_hook(frame) else _CELL_RUN.running
        raise KeyboardInterrupt


def _in_event_hook(frame: Any) -> bool:
    """Whether ``frame`` runs under IPython's ``EventManager.trigger``, which catches a
    KeyboardInterrupt (the cell then runs on: the interrupt is signalled again)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "trigger" and code.co_filename.endswith("events.py") and \
                "IPython" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def _swallowed(unraisable: Any, hook: Callable[[Any], None] = sys.unraisablehook) -> None:
    """``sys.unraisablehook``: a KeyboardInterrupt raised in a finalizer never reached the
    cell; Python's own hook (or the one before) reports it as ever."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _CELL_RUN.raised = 0
    hook(unraisable)


def _make_sure_interrupted(cell: int) -> None:
    """After an interrupt: while the main thread still runs a cell up to ``cell`` and no
    KeyboardInterrupt reached it, signal again (a few times, then leave it be)."""
    main = threading.main_thread().ident
    for _ in range(_RESIGNAL_TRIES):
        time.sleep(_RESIGNAL_AFTER)
        run = _CELL_RUN
        if not (_executing and 0 < run.running <= cell and run.raised != run.running):
            return
        signal.pthread_kill(main, signal.SIGINT)


def run_forked(cfg: RankConfig) -> None:
    """Entry point in the freshly forked child; never returns."""
    global _channel, _rank, _cfg
    _rank, _cfg = cfg.rank, cfg
    code = 0
    try:
        _die_with_parent()
        signal.signal(signal.SIGINT, _on_sigint)
        sys.unraisablehook = _swallowed
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(cfg.cwd)
        os.environ.clear()
        os.environ.update(cfg.env)
        sys.path[:] = cfg.path
        sys.argv = [f"nbdist-worker-{cfg.name}"]
        main = shell.main_module()  # the IPython shell's namespace (made in the template)
        sys.modules["__main__"] = main
        _channel = connect(cfg.socket, cfg.authkey, timeout=cfg.start_timeout)
        _channel.send(Hello(_rank, os.getpid()))
        _setup_output(cfg)
        _setup_debugger(cfg)
        shell.bind(_channel.send, _rank, cfg.name)
        comms.install(_channel.send, _rank)  # widgets made here show in the notebook
        if os.environ.get("NBDIST_TEST_STALL_RANK") == str(_rank):  # for the fault tests
            time.sleep(3600)  # never joins: the notebook's start deadline must end this
        if os.environ.get("NBDIST_TEST_FAIL_RANK") == str(_rank):  # for the fault tests
            raise RuntimeError(f"rank {_rank} fails at start-up on purpose "
                               "(NBDIST_TEST_FAIL_RANK is set)")
        _join_world(cfg)
        from ..telemetry import records, tracing

        records.start_worker_flusher(_metrics_outbox, _rank, cfg.name)
        tracing.arm(_rank, cfg.name)
        _channel.send(Ready(_rank, os.getpid()))
        _serve(main.__dict__)
    except BaseException:
        code = 1
        try:
            text = traceback.format_exc()
            if _channel is not None:
                _channel.send(Failed(_rank, text))
            else:
                os.write(2, text.encode())
        except BaseException:  # noqa: BLE001 - nothing may keep this process from exiting
            pass
    finally:
        try:
            _flush_all()
            if _channel is not None:
                _channel.close(timeout=2.0)
        finally:
            os._exit(code)


_streams: list[ChannelStream] = []


class _MetricsOutbox:
    """What telemetry hands its batches to: wraps each in a ``Metrics`` message. Lossless:
    while the notebook is slow to read it keeps waiting (it gives up only when closed)."""

    @staticmethod
    def send(batch: tuple) -> None:
        if _channel is None:
            return
        msg = Metrics(_rank, batch)
        while True:
            try:
                _channel.send(msg)
                return
            except ChannelBlocked:
                continue

    @staticmethod
    def drain(timeout: float) -> bool:
        return _channel.drain(timeout) if _channel is not None else True


_metrics_outbox = _MetricsOutbox()


def _setup_output(cfg: RankConfig) -> None:
    assert _channel is not None
    capture_fds(_channel, _rank)
    out = ChannelStream(_channel, _rank, "stdout")
    err = ChannelStream(_channel, _rank, "stderr")
    _streams[:] = [out, err]
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    import warnings

    warnings.simplefilter("default")  # show warnings like a notebook would...
    quiet.hide_warnings()  # ...but not torch's per-rank deprecation noise


def _setup_debugger(cfg: RankConfig) -> None:
    """Failures are kept for ``%dist_debug``; ``breakpoint()`` prompts in the notebook."""
    global _debugger
    import pdb

    assert _channel is not None
    _debugger = Debugger(_rank, cfg.name, _channel.send)
    rpc_hooks.set_on_failure(_debugger.remember)
    sys.breakpointhook = _debugger.set_trace
    pdb.set_trace = lambda *a, **k: _debugger.set_trace(sys._getframe(1))


def _flush_streams() -> None:
    """After each RPC function: printed output and logged metrics go before the reply.

    On the path of every RPC reply: no import statement; each step returns at once when
    nothing was printed or logged (a few microseconds in all)."""
    global _flush_records
    chan = _channel
    if chan is not None:
        flush = _flush_records
        if flush is None:
            from ..telemetry.records import flush_worker

            flush = _flush_records = flush_worker
        flush(_metrics_outbox, _rank)
        for s in _streams:
            s.flush()
        chan.drain(1.0)


_flush_records: Any = None  # telemetry.records.flush_worker, looked up once


def _flush_all() -> None:
    """Queue everything printed or logged so far (the channel writes it in order)."""
    from ..telemetry import records

    if _channel is not None:
        try:
            records.flush_worker(_metrics_outbox, _rank)
        except Exception:  # noqa: BLE001 - output must still go
            pass
    for s in _streams:
        try:
            s.flush()
        except Exception:  # noqa: BLE001
            pass


def _join_world(cfg: RankConfig) -> None:
    import torch

    torch.set_num_threads(cfg.threads)
    cuda.take(_rank, cfg.name, cfg.device)  # before any user code runs here
    if not cfg.rpc:
        _join_group_only(cfg)
        return
    membership.install_rpc_patches(after_call=_flush_streams)
    from ..telemetry import tracing

    tracing.install(_rank, cfg.name)
    if cfg.store:  # a world with hosts: rendezvous through the notebook's store
        from . import store

        store.use(store.RemoteStore(cfg.store, cfg.authkey, cfg.start_timeout))
    membership.join_rpc(cfg.name, _rank, cfg.world_size, cfg.rpc_init, cfg.rpc_timeout,
                        cfg.device_maps, threads=cfg.rpc_threads)
    from ..patches import rref_reset

    rref_reset.start_ids_at(cfg.epoch)  # RRef ids unlike any of an earlier world
    membership.rpc_joined(cfg.shm)
    if cfg.process_group:
        membership.join_group(cfg.process_group, cfg.pg_init, _rank, cfg.world_size,
                              cfg.pg_timeout, cfg.device)
    _let_user_groups_in(cfg)


def _let_user_groups_in(cfg: RankConfig) -> None:
    """User code's ``init_process_group`` here joins this world (``membership``)."""
    import torch.distributed as dist

    if cfg.store:  # a world with hosts: the notebook's store, over its own connection
        from . import store

        def make() -> Any:
            return store.RemoteStore(cfg.store, cfg.authkey, cfg.start_timeout)
    else:
        def make() -> Any:
            return dist.FileStore(cfg.user_groups, -1)
    membership.let_user_groups_in(_rank, cfg.world_size, cfg.name, make, cfg.pg_timeout,
                                  cfg.process_group, cfg.group_why)


def _leave_world() -> None:
    """Leave this process's RPC world and process group without waiting for any peer, and
    forget the per-process state that would keep it from joining the next one (the same
    reset rank 0 does before each world; ``patches.torch_private`` pins the names)."""
    membership.leave(interrupt=True, reset_rrefs=True)


def _start_rejoin(update: RankConfig) -> None:
    """``Rejoin``: leave and join in a thread of its own, so this reader stays free for
    interrupts and a ``Stop`` (which ends the process wherever the rejoin is)."""
    threading.Thread(target=_rejoin, args=(update,), name="nbdist-rejoin",
                     daemon=True).start()


def _rejoin(update: RankConfig) -> None:
    """Leave the old world, join the new one under the same rank, say ``Ready``; on failure
    say ``Failed`` with the traceback and exit (the notebook's start then names this rank)."""
    global _cfg
    assert _channel is not None and _cfg is not None
    with _rejoining:
        try:
            _leave_world()
            from ..patches import no_rpc

            no_rpc.leave()  # the new world may have RPC; a world without it says so again
            _cfg = _cfg.rejoined(update)
            os.environ["NBDIST_WORLD_SIZE"] = str(_cfg.world_size)
            os.environ.update(_cfg.launch_env)  # torchrun's, for the new world
            _join_world(_cfg)
            from ..telemetry import tracing

            tracing.arm(_rank, _cfg.name)
            _channel.send(Ready(_rank, os.getpid()))
        except BaseException:  # noqa: BLE001 - reported, then this process ends
            try:
                _channel.send(Failed(_rank, traceback.format_exc()))
                _flush_all()
                _channel.close(timeout=2.0)
            finally:
                os._exit(1)


def _join_group_only(cfg: RankConfig) -> None:
    """A world without RPC (``--no-rpc``): the process group is the world (a bare world has
    none); RPC calls here raise ``NoRpcError`` saying so."""
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    from ..patches import no_rpc

    no_rpc.enter(no_rpc.FLAG if rpc.is_available() else no_rpc.BUILD)
    if cfg.store:  # a world with hosts: rendezvous through the notebook's store
        from . import store

        arrivals = store.RemoteStore(cfg.store, cfg.authkey, cfg.start_timeout)
        store.use(arrivals)
    if not cfg.process_group:  # a bare world: no group either, as a spawned process
        _let_user_groups_in(cfg)
        return
    if not cfg.store:
        arrivals = dist.FileStore(cfg.arrivals, cfg.world_size)
    arrivals.set(cfg.arrived.format(rank=_rank), "1")  # rank 0 joins once all are here
    membership.join_group(cfg.process_group, cfg.pg_init, _rank, cfg.world_size,
                          cfg.pg_timeout, cfg.device)
    _let_user_groups_in(cfg)


def _serve(ns: dict) -> None:
    """Main-thread loop: run cells handed over by the reader thread until told to stop."""
    assert _channel is not None
    cells: queue.Queue = queue.Queue()
    threading.Thread(target=_read_commands, args=(cells,), name="nbdist-commands",
                     daemon=True).start()
    while True:
        item = cells.get()
        if item is None:
            return
        if isinstance(item, Debug):
            result = _post_mortem(item.exec_id)
        else:
            sys.last_value = None
            result = _run_cell(ns, item.code, item.filename, item.exec_id)
            if result.status == "error" and sys.last_value is not None:
                _debugger.remember(sys.last_value, sys.last_traceback)
        _flush_all()
        _channel.send(result)


def _post_mortem(exec_id: int) -> Result:
    """``%dist_debug``: a pdb session on this rank's last failure, run like a cell."""
    try:
        _debugger.post_mortem()
    except Exception as exc:  # noqa: BLE001 - reported to the notebook
        return Result(_rank, exec_id, "error", None, type(exc).__name__, safe_str(exc),
                      f"{type(exc).__name__}: {safe_str(exc)}\n")
    return Result(_rank, exec_id, "ok")


def _read_commands(cells: queue.Queue) -> None:
    """Reader thread: cells go to the main thread; interrupts, flushes and stops act at once."""
    global _queued, _cancelled
    assert _channel is not None
    while True:
        try:
            msg = _channel.recv()
        except ProtocolError as exc:
            _channel.send(Output(_rank, "stderr", f"nbdist: rank {_rank} dropped a control "
                                                  f"message it could not read: {exc}\n"))
            continue
        except (EOFError, OSError):
            os._exit(1)  # the notebook is gone: nothing to serve
        if isinstance(msg, (Exec, Debug)):
            if isinstance(msg, Exec):
                _queued = msg.exec_id
            cells.put(msg)
        elif isinstance(msg, DebugInput):
            _debugger.answer(msg.session, msg.line)
        elif isinstance(msg, Interrupt) and msg.rpc_only:
            rpc_hooks.interrupt_rpc_threads()  # the cell, if any, is not the one interrupted
        elif isinstance(msg, Interrupt):
            _cancelled = _queued  # before the signal: a cell about to begin sees it
            _debugger.end_all()
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            threading.Thread(target=_make_sure_interrupted, args=(_cancelled,), daemon=True,
                             name="nbdist-interrupt-check").start()  # ends within 1.5 s
            _drop_queued_output()
        elif isinstance(msg, (CommMsg, CommClose)):  # from a widget's view in the frontend
            comms.deliver(msg)
        elif isinstance(msg, Rejoin):
            _start_rejoin(msg.config)
        elif isinstance(msg, Flush):  # everything printed or logged so far goes before the ack
            _flush_all()
            _channel.send(Flushed(_rank, msg.token))
        elif isinstance(msg, Stop):
            _flush_all()
            _channel.close(timeout=2.0)
            os._exit(0)


def _drop_queued_output() -> None:
    """After Ctrl-C, output still queued here is not worth the wait: drop it, say how much."""
    assert _channel is not None
    before = _channel.dropped_bytes
    _channel.drop_pending()
    _channel.drain(1.0)
    lost = _channel.dropped_bytes - before
    if lost:
        _channel.send(Output(_rank, "stderr", f"nbdist: {lost / 1024:,.0f} KB of output not "
                                              "shown after the interrupt\n"))


def _run_cell(ns: dict, code: str, filename: str, exec_id: int) -> Result:
    """Run a cell through the worker's IPython shell (magics, ``!``, rich displays); the
    ``Result`` has the last expression's repr or the error and the cell's traceback."""
    global _executing
    try:
        _CELL_RUN.running = exec_id
        _executing = True
        try:
            if exec_id <= _cancelled:  # Ctrl-C came while it was on its way
                raise KeyboardInterrupt
            rpc_rerun.cell_started()
            result = shell.run_cell(code, filename, exec_id, lambda: exec_id <= _cancelled)
            rpc_rerun.cell_ended(result.status != "ok")
            return result
        finally:
            _executing = False
            _CELL_RUN.running = 0
    except BaseException as exc:  # noqa: BLE001 - Ctrl-C just after the shell returned
        return Result(_rank, exec_id, "error", None, type(exc).__name__, safe_str(exc),
                      f"{type(exc).__name__}: {safe_str(exc)}\n")
