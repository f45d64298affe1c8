"""The receiver: one thread reads every worker's control channel and routes each message.

What ranks on another host send through their join agent (``Relayed``, read by the agent's
own thread) is queued by ``relayed`` and handled here too, each frame as from its rank.
Nothing a worker sends can stop it: a frame that does not decode is reported once per rank
(naming it) and dropped; a broken stream closes that rank's channel only; an exception in a
handler is reported and the loop goes on.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

from ..comms.relay import CommRelay
from ..control.protocol import (
    ClearOutput,
    CommClose,
    CommMsg,
    CommOpen,
    DebugEnd,
    DebugPrompt,
    DisplayChunk,
    DisplayData,
    Failed,
    Flushed,
    FramingError,
    Message,
    Metrics,
    Output,
    ProtocolError,
    Ready,
    Relayed,
    Result,
    Returned,
    decode,
)
from ..debugging.prompts import DebugDesk
from ..fd_wait import readable
from ..rank_info import RankInfo
from ..telemetry import records, timing, tracing  # noqa: F401 - their internal-record handlers
from .rich_output import RichOutput
from .router import Router

__all__ = ["Receiver"]

REPORT_EVERY = 5.0  # seconds between two reports of bad frames from one rank
TICK = 0.05  # seconds between two looks at held lines and live lines


def _readable(fd: int) -> bool:
    try:
        return bool(readable((fd,), 0))
    except (OSError, ValueError):
        return False


class Receiver:
    """Owns the receiving thread; ``stop`` ends it (with a deadline). A rank's results and
    flush answers go to the callbacks the world's cells give (``on_result(result)``,
    ``on_flushed(rank, token)``, a relayed view call's answer ``on_returned(returned)``),
    its widgets' messages to ``comms``."""

    def __init__(self, ranks: dict[int, RankInfo], router: Router, rich: RichOutput,
                 desk: DebugDesk, comms: CommRelay, cv: threading.Condition, *,
                 on_result: Callable[[Result], None],
                 on_flushed: Callable[[int, int], None],
                 on_returned: Callable[[Returned], None]) -> None:
        self.ranks, self.router, self.cv = ranks, router, cv
        self.rich, self.desk, self.comms = rich, desk, comms
        self._on_result, self._on_flushed = on_result, on_flushed
        self._on_returned = on_returned
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._reported: dict[int, float] = {}
        self._busy: int | None = None  # the rank whose message is being handled
        self._progress = threading.Condition()
        self.dropped: dict[int, int] = {}  # rank -> frames dropped, for tests and status
        self._relayed: collections.deque[Relayed] = collections.deque()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="nbdist-receiver")

    def start(self) -> None:
        self._thread.start()

    @property
    def started(self) -> bool:
        """Whether ``start`` was called (a kept world's rebuild finds it running)."""
        return self._thread.ident is not None

    def is_current_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread (the channels are closed by their owner first)."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive() and not self.is_current_thread():
            self._thread.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def relayed(self, host: str, msg: Relayed) -> None:
        """A join agent's batch of its ranks' frames (from the agent's reader thread): handled
        by the receiving thread, in order."""
        self._relayed.append(msg)
        self.poke()

    def _take_relayed(self) -> None:
        while self._relayed:
            for ranks, payload in self._relayed.popleft().entries:
                infos = [i for i in map(self.ranks.get, ranks) if i is not None]
                if not infos:
                    continue
                try:
                    msg = decode(payload)
                except ProtocolError as exc:
                    self.dropped[infos[0].rank] = self.dropped.get(infos[0].rank, 0) + 1
                    self._report(infos[0], f"dropped a relayed control message: {exc}")
                    continue
                for info in infos:  # an equal line of several ranks: each rank's own
                    self._busy = info.rank
                    try:
                        self._dispatch(info, msg)
                    except Exception as exc:  # noqa: BLE001 - as for a frame of its own
                        self._report(info, f"a relayed {msg.TAG!r} message could not be "
                                           f"handled: {exc!r}")
                    finally:
                        self._busy = None
            with self._progress:
                self._progress.notify_all()

    def poke(self) -> None:
        """Make the loop look at the channel set again."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- the loop -----------------------------------------------------------------------------
    def _loop(self) -> None:
        next_tick = 0.0
        while not self._stopping:
            # list() copies in one step: a keep-restart adds and removes ranks meanwhile
            by_fd = {i.channel.fileno(): i for i in list(self.ranks.values())
                     if i.channel is not None and not i.channel.closed}
            wait = TICK
            due = self.router.next_due()  # a line held for merging is shown on time
            if due is not None:
                wait = min(TICK, max(due - time.monotonic(), 0.002))
                next_tick = min(next_tick, due)
            try:
                ready = readable([self._wake_r, *by_fd], wait)
            except (OSError, ValueError):  # a channel closed under us: look again
                time.sleep(0.01)
                continue
            woken = self._wake_r in ready
            for fd in ready:
                if fd == self._wake_r:
                    continue
                info = by_fd[fd]
                if info.channel is not None:
                    self._busy = info.rank
                    try:
                        self._read_one(info)
                    except Exception as exc:  # noqa: BLE001 - the last line of defence
                        Router.write("stderr", f"nbdist: receiving from {info.label()} failed: "
                                               f"{exc!r}\n")
                    finally:
                        self._busy = None
                        with self._progress:
                            self._progress.notify_all()
            if woken:  # after the ranks' own frames: what a relayed answer's call printed
                try:  # on its control channel goes first
                    os.read(self._wake_r, 4096)
                except OSError:
                    pass
                self._take_relayed()
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK
                try:
                    self.router.tick()
                except Exception as exc:  # noqa: BLE001 - displays must not stop the receiver
                    Router.write("stderr", f"nbdist: showing worker output failed: {exc!r}\n")

    def caught_up(self, rank: int, timeout: float = 1.0) -> bool:
        """Wait until everything ``rank`` had written to its channel so far has been shown.

        A worker writes its output to the channel before it sends an RPC's reply, so after
        the reply this makes the output appear before whatever the caller prints next.
        """
        info = self.ranks.get(rank)
        chan = info.channel if info is not None else None
        if chan is None or self.is_current_thread() or self._stopping:
            return True
        fd = chan.fileno()
        deadline = time.monotonic() + timeout
        with self._progress:
            while self._busy == rank or _readable(fd):
                left = deadline - time.monotonic()
                if left <= 0 or chan.closed:
                    return False
                self._progress.wait(min(left, 0.05))
        return True

    def _read_one(self, info: RankInfo) -> None:
        chan = info.channel
        assert chan is not None
        try:
            msg = chan.recv()
        except FramingError as exc:
            self._report(info, f"its control stream is out of step ({exc}); its channel was "
                               "closed", force=True)
            self._lost(info)
            return
        except ProtocolError as exc:
            self.dropped[info.rank] = self.dropped.get(info.rank, 0) + 1
            self._report(info, f"dropped a control message: {exc}")
            return
        except (EOFError, OSError):
            self._lost(info)
            return
        try:
            self._dispatch(info, msg)
        except Exception as exc:  # noqa: BLE001 - one bad message must not stop the receiver
            self._report(info, f"a {msg.TAG!r} message could not be handled: {exc!r}")

    def _dispatch(self, info: RankInfo, msg: Message) -> None:
        if isinstance(msg, Output):
            self.router.feed(info.rank, info.name, msg.stream, msg.text)
        elif isinstance(msg, Metrics):
            records.deliver(msg.batch)
        elif isinstance(msg, Result):
            self.router.flush(info.rank, release=False)  # the cell's end shows held lines
            self.router.finished(info.rank, msg.status == "ok")
            self._on_result(msg)
        elif isinstance(msg, Flushed):
            self._on_flushed(info.rank, msg.token)
        elif isinstance(msg, Returned):  # a relayed view call's answer
            self._on_returned(msg)
        elif isinstance(msg, Ready):
            with self.cv:
                info.ready = True
                self.cv.notify_all()
        elif isinstance(msg, (DisplayData, ClearOutput)):
            self.router.flush(info.rank)  # what it printed before shows before
            self.rich.show(info.rank, info.name, msg)
        elif isinstance(msg, DisplayChunk):  # a piece of a big display: shown when complete
            whole = self.rich.piece(info.rank, msg)
            if whole is not None:
                self.router.flush(info.rank)
                self.rich.show(info.rank, info.name, whole)
        elif isinstance(msg, CommOpen):  # a widget made on the worker
            self.router.flush(info.rank)
            self.comms.opened(info.rank, info.name, msg)
        elif isinstance(msg, CommMsg):
            self.comms.message(info.rank, msg)
        elif isinstance(msg, CommClose):
            self.comms.closed(info.rank, msg)
        elif isinstance(msg, (DebugPrompt, DebugEnd)):
            self.desk.arrived(msg)
        elif isinstance(msg, Failed):
            with self.cv:
                info.failure = msg.traceback
                self.cv.notify_all()
        else:
            raise ProtocolError(f"a {msg.TAG!r} message, which workers do not send")

    def _lost(self, info: RankInfo) -> None:
        """The channel closed: the worker exited or is about to; the template says how.

        No waiting here: this thread carries every other rank's output, and the template's
        reader records the exit status and wakes any waiter.
        """
        chan, info.channel = info.channel, None
        if chan is not None:
            chan.close(timeout=0)

    def _report(self, info: RankInfo, what: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._reported.get(info.rank, -REPORT_EVERY) < REPORT_EVERY:
            return
        self._reported[info.rank] = now
        Router.write("stderr", f"nbdist: {info.label()} {what}\n")
