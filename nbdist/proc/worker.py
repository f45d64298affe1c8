"""What runs inside a worker rank, from the fork in the template to ``os._exit``.

Start-up: die with the template, take the notebook's cwd/env/sys.path, connect to the control
socket, capture output, take its GPU (if it has one), join the RPC world (and the process
group, if asked), say ready.
Then the main thread runs ``%%dist`` cells from a queue while a reader thread handles
interrupts and stop requests at once, even while a cell runs. A rank on another host also
reads its pipe to the join agent (``hosts.rank_pipes``): a cell that came that way sends its
output, displays and result back the same way, for the agent to batch.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from ..comms import channel_comm as comms
from ..control.channel import Channel, ChannelBlocked, ChannelClosed, connect
from ..control.protocol import (
    Call,
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
    Returned,
    Stop,
)
from ..debugging.remote_pdb import Debugger
from ..errors import safe_str
from ..output.rank_streams import ChannelStream, capture_fds
from ..patches import quiet, rpc_hooks, rpc_rerun
from ..rank_config import RankConfig
from . import cuda, membership, shell

__all__ = ["run_forked", "current_channel"]

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


class _RankOfThisProcess:
    """The ``Worker`` this process is, made once at the fork (``run_forked``); None in the
    notebook's process and the template."""

    def __init__(self) -> None:
        self.worker: Worker | None = None


_RANK_PER_PROCESS = _RankOfThisProcess()


def current_channel() -> Channel | None:
    """The control channel of this worker (None on the notebook)."""
    worker = _RANK_PER_PROCESS.worker
    return worker.channel if worker is not None else None


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


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


def run_forked(cfg: RankConfig, relay_fd: int | None = None) -> None:
    """Entry point in the freshly forked child; never returns. ``relay_fd``: its end of the
    pipe to the join agent that forked it (none from the local template)."""
    worker = _RANK_PER_PROCESS.worker = Worker(cfg, relay_fd)
    worker.run()


class _Sink:
    """Where what a cell emits goes (output, displays, widgets, debugger prompts, results):
    the control channel, or while a relayed cell runs the pipe to the agent, so that its
    output and its result travel one path, in order."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.target: Channel | None = None  # the relay while a relayed cell runs

    def send(self, msg: Any, block: float = 10.0, droppable: bool = False) -> int:
        chan = self.target or self.worker.channel
        if chan is None:
            raise ChannelClosed("this rank has no control channel yet")
        return chan.send(msg, block=block, droppable=droppable)

    def drain(self, timeout: float = 5.0) -> bool:
        chan = self.target or self.worker.channel
        return chan.drain(timeout) if chan is not None else True


class _MetricsOutbox:
    """What telemetry hands its batches to: wraps each in a ``Metrics`` message. Lossless:
    while the notebook is slow to read it keeps waiting (it gives up only when closed)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def send(self, batch: tuple) -> None:
        chan = self.worker.channel
        if chan is None:
            return
        msg = Metrics(self.worker.rank, batch)
        while True:
            try:
                chan.send(msg)
                return
            except ChannelBlocked:
                continue

    def drain(self, timeout: float) -> bool:
        chan = self.worker.channel
        return chan.drain(timeout) if chan is not None else True


class Worker:
    """This process's rank, for the process's life: its config (each ``Rejoin`` brings a new
    world's), control channel, output streams, debugger and the state of its cells."""

    def __init__(self, cfg: RankConfig, relay_fd: int | None = None) -> None:
        self.cfg = cfg
        self.rank = cfg.rank
        self.channel: Channel | None = None
        self.relay_fd = relay_fd
        self.relay: Channel | None = None  # the pipe to the join agent (hosts.rank_pipes)
        self.sink = _Sink(self)
        self.relayed: set[int] = set()  # ids of the cells that came through the relay
        self.rejoining = threading.Lock()  # held while a rejoin thread leaves for the next world
        self.debugger: Debugger = None  # type: ignore[assignment] - set at start-up
        self.streams: list[ChannelStream] = []
        self.outbox = _MetricsOutbox(self)
        self.executing = False
        self.queued = 0  # the id of the last cell handed to the main thread
        self.cancelled = 0  # cells up to this id were interrupted: one not begun yet does not run
        self.cell_run = _CellRun()
        self._flush_records: Any = None  # telemetry.records.flush_worker, looked up once
        self._unraisablehook = sys.unraisablehook  # the one before ours

    def run(self) -> None:
        """Serve as this rank until told to stop; ends the process."""
        cfg = self.cfg
        code = 0
        try:
            _die_with_parent()
            signal.signal(signal.SIGINT, self._on_sigint)
            sys.unraisablehook = self._swallowed
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.chdir(cfg.cwd)
            os.environ.clear()
            os.environ.update(cfg.env)
            sys.path[:] = cfg.path
            sys.argv = [f"nbdist-worker-{cfg.name}"]
            main = shell.main_module()  # the IPython shell's namespace (made in the template)
            sys.modules["__main__"] = main
            self.channel = connect(cfg.socket, cfg.authkey, timeout=cfg.start_timeout)
            self.channel.send(Hello(self.rank, os.getpid()))
            if self.relay_fd is not None:
                self.relay = Channel(socket.socket(fileno=self.relay_fd), name="the agent")
            self._setup_output(cfg)
            self._setup_debugger(cfg)
            shell.bind(self.sink.send, self.rank, cfg.name)
            comms.install(self.sink.send, self.rank)  # widgets made here show in the notebook
            if os.environ.get("NBDIST_TEST_STALL_RANK") == str(self.rank):  # for the fault tests
                time.sleep(3600)  # never joins: the notebook's start deadline must end this
            if os.environ.get("NBDIST_TEST_FAIL_RANK") == str(self.rank):  # for the fault tests
                raise RuntimeError(f"rank {self.rank} fails at start-up on purpose "
                                   "(NBDIST_TEST_FAIL_RANK is set)")
            self._join_world(cfg)
            from ..telemetry import records, tracing

            records.start_worker_flusher(self.outbox, self.rank, cfg.name)
            tracing.arm(self.rank, cfg.name)
            self.channel.send(Ready(self.rank, os.getpid()))
            self._serve(main.__dict__)
        except BaseException:
            code = 1
            try:
                text = traceback.format_exc()
                if self.channel is not None:
                    self.channel.send(Failed(self.rank, text))
                else:
                    os.write(2, text.encode())
            except BaseException:  # noqa: BLE001 - nothing may keep this process from exiting
                pass
        finally:
            try:
                self._flush_all()
                self._close_channels()
            finally:
                os._exit(code)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        rpc_hooks.interrupt_rpc_threads()
        if self.executing:
            self.cell_run.raised = 0 if _in_event_hook(frame) else self.cell_run.running
            raise KeyboardInterrupt

    def _swallowed(self, unraisable: Any) -> None:
        """``sys.unraisablehook``: a KeyboardInterrupt raised in a finalizer never reached the
        cell; Python's own hook (or the one before) reports it as ever."""
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.cell_run.raised = 0
        self._unraisablehook(unraisable)

    def _make_sure_interrupted(self, cell: int) -> None:
        """After an interrupt: while the main thread still runs a cell up to ``cell`` and no
        KeyboardInterrupt reached it, signal again (a few times, then leave it be)."""
        main = threading.main_thread().ident
        for _ in range(_RESIGNAL_TRIES):
            time.sleep(_RESIGNAL_AFTER)
            run = self.cell_run
            if not (self.executing and 0 < run.running <= cell and run.raised != run.running):
                return
            signal.pthread_kill(main, signal.SIGINT)

    def _close_channels(self) -> None:
        """Write what is queued on the pipe to the agent, then on the control channel."""
        for chan in (self.relay, self.channel):
            if chan is not None:
                chan.close(timeout=2.0)

    def _setup_output(self, cfg: RankConfig) -> None:
        assert self.channel is not None
        capture_fds(self.sink, self.rank)
        out = ChannelStream(self.sink, self.rank, "stdout")
        err = ChannelStream(self.sink, self.rank, "stderr")
        self.streams[:] = [out, err]
        sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
        import warnings

        warnings.simplefilter("default")  # show warnings like a notebook would...
        quiet.hide_warnings()  # ...but not torch's per-rank deprecation noise

    def _setup_debugger(self, cfg: RankConfig) -> None:
        """Failures are kept for ``%dist_debug``; ``breakpoint()`` prompts in the notebook."""
        import pdb

        assert self.channel is not None
        self.debugger = Debugger(self.rank, cfg.name, self.sink.send)
        rpc_hooks.set_on_failure(self.debugger.remember)
        sys.breakpointhook = self.debugger.set_trace
        pdb.set_trace = lambda *a, **k: self.debugger.set_trace(sys._getframe(1))

    def _flush_streams(self) -> None:
        """After each RPC function: printed output and logged metrics go before the reply.

        On the path of every RPC reply: no import statement; each step returns at once when
        nothing was printed or logged (a few microseconds in all)."""
        chan = self.channel
        if chan is not None:
            flush = self._flush_records
            if flush is None:
                from ..telemetry.records import flush_worker

                flush = self._flush_records = flush_worker
            flush(self.outbox, self.rank)
            for s in self.streams:
                s.flush()
            self.sink.drain(1.0)

    def _flush_all(self) -> None:
        """Queue everything printed or logged so far (the channel writes it in order)."""
        from ..telemetry import records

        if self.channel is not None:
            try:
                records.flush_worker(self.outbox, self.rank)
            except Exception:  # noqa: BLE001 - output must still go
                pass
        for s in self.streams:
            try:
                s.flush()
            except Exception:  # noqa: BLE001
                pass

    def _join_world(self, cfg: RankConfig) -> None:
        """Take this rank's threads and device, then join the world (``membership.join``,
        the sequence rank 0 takes too)."""
        import torch

        torch.set_num_threads(cfg.threads)
        cuda.take(self.rank, cfg.name, cfg.device)  # before any user code runs here
        membership.join(cfg, membership.Steps(cfg, after_call=self._flush_streams))

    def _leave_world(self) -> None:
        """Leave this process's RPC world and process group without waiting for any peer, and
        forget the per-process state that would keep it from joining the next one (the same
        reset rank 0 does before each world; ``patches.torch_private`` pins the names)."""
        membership.leave(interrupt=True, reset_rrefs=True)

    def _start_rejoin(self, update: RankConfig) -> None:
        """``Rejoin``: leave and join in a thread of its own, so this reader stays free for
        interrupts and a ``Stop`` (which ends the process wherever the rejoin is)."""
        threading.Thread(target=self._rejoin, args=(update,), name="nbdist-rejoin",
                         daemon=True).start()

    def _rejoin(self, update: RankConfig) -> None:
        """Leave the old world, join the new one under the same rank, say ``Ready``; on failure
        say ``Failed`` with the traceback and exit (the notebook's start then names this rank)."""
        assert self.channel is not None and self.cfg is not None
        with self.rejoining:
            try:
                self._leave_world()
                from ..patches import no_rpc

                no_rpc.leave()  # the new world may have RPC; a world without it says so again
                self.cfg = self.cfg.rejoined(update)
                os.environ["NBDIST_WORLD_SIZE"] = str(self.cfg.world_size)
                os.environ.update(self.cfg.launch_env)  # torchrun's, for the new world
                self._join_world(self.cfg)
                from ..telemetry import tracing

                tracing.arm(self.rank, self.cfg.name)
                self.channel.send(Ready(self.rank, os.getpid()))
            except BaseException:  # noqa: BLE001 - reported, then this process ends
                try:
                    self.channel.send(Failed(self.rank, traceback.format_exc()))
                    self._flush_all()
                    self.channel.close(timeout=2.0)
                finally:
                    os._exit(1)

    def _serve(self, ns: dict) -> None:
        """Main-thread loop: run cells handed over by the reader thread until told to stop."""
        assert self.channel is not None
        cells: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_commands, args=(cells, self.channel),
                         name="nbdist-commands", daemon=True).start()
        if self.relay is not None:
            threading.Thread(target=self._read_commands, args=(cells, self.relay),
                             name="nbdist-relayed-commands", daemon=True).start()
        while True:
            item = cells.get()
            if item is None:
                return
            relayed = isinstance(item, Exec) and item.exec_id in self.relayed
            if relayed:
                self.relayed.discard(item.exec_id)
                self._flush_all()  # what was printed before goes the old way first
                self.sink.target = self.relay
            try:
                if isinstance(item, Debug):
                    result = self._post_mortem(item.exec_id)
                else:
                    sys.last_value = None
                    result = self._run_cell(ns, item.code, item.filename, item.exec_id)
                    if result.status == "error" and sys.last_value is not None:
                        self.debugger.remember(sys.last_value, sys.last_traceback)
                self._flush_all()
                self._send_result(result)
            finally:
                self.sink.target = None

    def _send_result(self, result: Result) -> None:
        """The cell's result, after its output, on the path the cell came by."""
        try:
            self.sink.send(result)
        except ChannelClosed:  # the agent is gone (it kills this rank): say it directly
            assert self.channel is not None
            self.sink.target = None
            self.channel.send(result)

    def _post_mortem(self, exec_id: int) -> Result:
        """``%dist_debug``: a pdb session on this rank's last failure, run like a cell."""
        try:
            self.debugger.post_mortem()
        except Exception as exc:  # noqa: BLE001 - reported to the notebook
            return Result(self.rank, exec_id, "error", None, type(exc).__name__, safe_str(exc),
                          f"{type(exc).__name__}: {safe_str(exc)}\n")
        return Result(self.rank, exec_id, "ok")

    def _read_commands(self, cells: queue.Queue, chan: Channel) -> None:
        """Reader thread of ``chan`` (the control channel, or the pipe to the agent): cells
        go to the main thread; interrupts, flushes and stops act at once."""
        assert self.channel is not None
        while True:
            try:
                msg = chan.recv()
            except ProtocolError as exc:
                self.channel.send(Output(self.rank, "stderr", f"nbdist: rank {self.rank} "
                                         f"dropped a control message it could not read: {exc}\n"))
                continue
            except (EOFError, OSError):
                if chan is self.relay:
                    return  # the agent is gone: it ends this rank, or the notebook does
                os._exit(1)  # the notebook is gone: nothing to serve
            if isinstance(msg, (Exec, Debug)):
                if isinstance(msg, Exec):
                    if chan is self.relay:
                        self.relayed.add(msg.exec_id)
                    self.queued = msg.exec_id
                cells.put(msg)
            elif isinstance(msg, DebugInput):
                self.debugger.answer(msg.session, msg.line)
            elif isinstance(msg, Interrupt) and msg.rpc_only:
                rpc_hooks.interrupt_rpc_threads()  # the cell, if any, is not the one interrupted
            elif isinstance(msg, Interrupt):
                self.cancelled = self.queued  # before the signal: a cell about to begin sees it
                self.debugger.end_all()
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                threading.Thread(target=self._make_sure_interrupted, args=(self.cancelled,),
                                 daemon=True, name="nbdist-interrupt-check").start()  # <= 1.5 s
                self._drop_queued_output()
            elif isinstance(msg, Call):  # a view's call, relayed: beside any cell, as RPCs run
                threading.Thread(target=self._call, args=(msg,), name="nbdist-view-call",
                                 daemon=True).start()
            elif isinstance(msg, (CommMsg, CommClose)):  # from a widget's view in the frontend
                comms.deliver(msg)
            elif isinstance(msg, Rejoin):
                self._start_rejoin(msg.config)
            elif isinstance(msg, Flush):  # everything printed or logged so far goes before the ack
                self._flush_all()
                self.sink.send(Flushed(self.rank, msg.token))  # the path the output took
            elif isinstance(msg, Stop):
                self._flush_all()
                self._close_channels()
                os._exit(0)

    def _call(self, msg: Call) -> None:
        """A view's call that came through the agent: run on this thread as an RPC function
        (``rpc_hooks.run_as_rpc_function``: interrupts, output and failures are an RPC
        function's), else (an ``async_execution`` function, or torch's callee not patched) as
        an RPC to this rank itself; the answer goes back the way the call came (the agent
        waits for its other ranks' and sends theirs in one frame), after what the call printed
        went on the control channel (``after_call`` flushed it). The notebook keeps the call's
        timeout."""
        import pickle

        import torch.distributed.rpc as rpc

        from ..shipping.pickler import dumps

        try:
            fn, args, kwargs = pickle.loads(msg.payload)
            value = rpc_hooks.run_as_rpc_function(fn, args, kwargs)
            if value is NotImplemented:
                value = rpc.rpc_sync(self.cfg.name, fn, args=args, kwargs=kwargs,
                                     timeout=msg.timeout)
            reply = Returned(self.rank, msg.call_id, "ok", dumps(value))
        except BaseException as exc:  # noqa: BLE001 - the caller's to see, as over RPC
            reply = Returned(self.rank, msg.call_id, "error", b"", type(exc).__name__,
                             safe_str(exc))
        back = self.relay if self.relay is not None and not self.relay.closed else self.channel
        assert back is not None
        try:
            back.send(reply)
        except OSError:
            pass  # the notebook (or the agent) is gone

    def _drop_queued_output(self) -> None:
        """After Ctrl-C, output still queued here is not worth the wait: drop it, say how much."""
        chans = [c for c in (self.channel, self.relay) if c is not None]
        before = sum(c.dropped_bytes for c in chans)
        for chan in chans:
            chan.drop_pending()
        for chan in chans:
            chan.drain(1.0)
        lost = sum(c.dropped_bytes for c in chans) - before
        if lost:
            self.sink.send(Output(self.rank, "stderr", f"nbdist: {lost / 1024:,.0f} KB of "
                                  "output not shown after the interrupt\n"))

    def _run_cell(self, ns: dict, code: str, filename: str, exec_id: int) -> Result:
        """Run a cell through the worker's IPython shell (magics, ``!``, rich displays); the
        ``Result`` has the last expression's repr or the error and the cell's traceback."""
        try:
            self.cell_run.running = exec_id
            self.executing = True
            try:
                if exec_id <= self.cancelled:  # Ctrl-C came while it was on its way
                    raise KeyboardInterrupt
                rpc_rerun.cell_started()
                result = shell.run_cell(code, filename, exec_id, lambda: exec_id <= self.cancelled)
                rpc_rerun.cell_ended(result.status != "ok")
                return result
            finally:
                self.executing = False
                self.cell_run.running = 0
        except BaseException as exc:  # noqa: BLE001 - Ctrl-C just after the shell returned
            return Result(self.rank, exec_id, "error", None, type(exc).__name__, safe_str(exc),
                          f"{type(exc).__name__}: {safe_str(exc)}\n")
