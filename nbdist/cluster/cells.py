"""Cells on workers: hand a cell out, collect results (never hanging), report, interrupt, flush.

A cell, interrupt, flush or stop for ranks on another host goes to that host's join agent as
one ``Relay`` frame (``hosts.rank_pipes`` hands it on to each rank), not one frame per rank;
``frames`` counts what was sent (``cluster.frames``)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..comms.relay import CommRelay
from ..control.channel import Channel
from ..control.protocol import Exec, Flush, Interrupt, Message, Result, encode
from ..debugging.prompts import DebugDesk
from ..errors import (
    CellInterrupted,
    DistCellError,
    DistTimeoutError,
    RankFailure,
    WorkerDiedError,
    ranks_named,
)
from ..output.rich_output import RichOutput
from ..output.router import Router, StatusLine
from ..rank_info import RankInfo
from ..rank_sets import SMALL, grouped, labels, named, rank_set
from .frames import SentFrames
from .hints import where_defined
from .relayed_calls import RelayedCalls

__all__ = ["Cells"]

SENT_KEPT = 100  # cells whose targets are remembered until their report
#: after Ctrl-C: how long workers have to say where they stopped (the wait ends as soon as
#: every rank said); longer than a worker's resend of an interrupt Python swallowed
#: (``proc.worker._RESIGNAL_AFTER``, 0.3 s), so a rank that needed one still says where
#: (0.3 s here once left one rank "still running" on a busy 2-core machine)
STOP_GRACE = 0.8


class CellResults(dict):
    """rank -> ``Result`` (None: its process ended first), with ``sent``: the ``RankInfo``
    each rank had when the cell was sent (a keep-restart may have replaced it since), and
    ``finished``: when each result arrived."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: dict[int, RankInfo] = {}
        self.finished: dict[int, float] = {}  # rank -> when its result arrived (monotonic)


class Cells:
    """Cell bookkeeping of one world: results by cell id, flush acknowledgements by token."""

    def __init__(self, ranks: dict[int, RankInfo], cv: threading.Condition,
                 require_running: Callable[[str], None], ids: Iterator[int]) -> None:
        """``ids``: the process's counter of cell ids and flush tokens (unique across worlds)."""
        self.ranks, self.cv, self._require, self._ids = ranks, cv, require_running, ids
        self.desk = DebugDesk(ranks, self.send)
        self.rich = RichOutput(ranks)  # workers' displays, figures, rich values
        self.comms = CommRelay(self.send)  # workers' widgets, relayed to the frontend
        self.last_failed: int | None = None  # the rank whose error was shown last
        self.frames = SentFrames()
        # the world's: the join agent that relays to a rank (``HostAgent.relay``), or None
        self.agent_of: Callable[[RankInfo], Any] | None = None
        self.calls = RelayedCalls(ranks, ids, self.send_all)  # views' calls through agents
        self._results: dict[int, dict[int, Result]] = {}
        self._finished: dict[int, dict[int, float]] = {}  # exec id -> rank -> when (monotonic)
        self._flushed: dict[int, set[int]] = {}
        # exec id -> the RankInfo each target had when the cell was sent: a rank that
        # `--heal` or `restart(keep=True)` replaced meanwhile never answers that cell
        self._sent: collections.OrderedDict[int, dict[int, RankInfo]] = \
            collections.OrderedDict()

    # -- called by the receiver ---------------------------------------------------------------
    def deliver(self, result: Result) -> None:
        with self.cv:
            self._results.setdefault(result.exec_id, {})[result.rank] = result
            self._finished.setdefault(result.exec_id, {})[result.rank] = time.monotonic()
            self.cv.notify_all()

    def flushed(self, rank: int, token: int) -> None:
        with self.cv:
            self._flushed.setdefault(token, set()).add(rank)
            self.cv.notify_all()

    # -- sending ------------------------------------------------------------------------------
    def next_id(self) -> int:
        """A fresh cell id or flush token."""
        return next(self._ids)

    def send(self, rank: int, msg: Message, exec_id: int | None = None) -> bool:
        """Send ``msg`` to ``rank``; False when it is gone (nothing raised)."""
        info = self.ranks[rank]
        chan: Channel | None = info.channel
        if chan is None or not info.alive:
            return False
        try:
            nbytes = chan.send(msg)
        except OSError:
            return False
        self.frames.add(msg.TAG, nbytes, relayed=False, exec_id=exec_id)
        return True

    def send_all(self, targets: list[int], msg: Message, exec_id: int | None = None) -> list[int]:
        """Send ``msg`` to each of ``targets``: a rank here directly, the ranks of another
        host in one frame to its agent; returns the ranks it went to (the others are gone)."""
        by_agent: dict[Any, list[int]] = {}
        sent = []
        for r in targets:
            info = self.ranks[r]
            agent = self.agent_of(info) if self.agent_of is not None else None
            if agent is None:
                if self.send(r, msg, exec_id):
                    sent.append(r)
            elif info.alive and info.channel is not None:
                by_agent.setdefault(agent, []).append(r)
        payload = encode(msg) if by_agent else b""
        for agent, ranks in by_agent.items():
            try:
                nbytes = agent.relay(ranks, payload)
            except OSError:
                continue  # its host is lost: the ranks' deaths are told as ever
            self.frames.add(msg.TAG, nbytes, relayed=True, exec_id=exec_id)
            sent.extend(ranks)
        return sent

    def send_cell(self, code: str, targets: list[int]) -> int:
        """Hand a cell to the targets without waiting; returns the id ``collect`` takes."""
        self._require("run a cell")
        dead = [r for r in targets if not self.ranks[r].alive]
        if dead:
            info = self.ranks[dead[0]]
            raise WorkerDiedError(info.rank, info.name, info.reason(),
                                  "asked to run a cell; `%dist_restart` starts a fresh world")
        exec_id = self.next_id()
        with self.cv:
            self._sent[exec_id] = {r: self.ranks[r] for r in targets}
            while len(self._sent) > SENT_KEPT:
                self._sent.popitem(last=False)
        self.send_all(targets, Exec(exec_id, code, f"<dist-cell-{exec_id}>"), exec_id)
        return exec_id

    def interrupt(self, targets: list[int]) -> None:
        """KeyboardInterrupt in the cell and RPC functions running on these ranks."""
        self.send_all(targets, Interrupt())

    def interrupt_rpc(self, rank: int) -> None:
        """KeyboardInterrupt in the RPC functions running on ``rank`` (not its cell)."""
        self.send(rank, Interrupt(rpc_only=True))

    # -- waiting ------------------------------------------------------------------------------
    def collect(self, exec_id: int, targets: list[int], timeout: float | None,
                partial: bool = False, announce: bool = True) -> dict:
        """Wait for a cell's results; interrupts and deaths are handled, never hangs.
        ``partial``: at the timeout, the ranks still running are interrupted and the results
        that arrived are returned (the others absent) instead of raising. ``announce``: a
        rank's failure is shown the moment it arrives (not for ``mp.spawn``, whose error
        alone says it, as in a script)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return self._wait(exec_id, targets, deadline, partial, announce)
        except KeyboardInterrupt as exc:
            raise self._interrupted(exec_id, targets).with_traceback(exc.__traceback__) \
                from None
        finally:
            with self.cv:
                self._results.pop(exec_id, None)
                self._finished.pop(exec_id, None)

    def _interrupted(self, exec_id: int, targets: list[int]) -> CellInterrupted:
        """Ctrl-C: interrupt the ranks still running the cell and give them ``STOP_GRACE``
        to say where they stopped (the notebook comes back regardless, a second Ctrl-C
        sooner); the error names each rank, at its own line."""
        self.interrupt(self.pending(exec_id, targets))
        end = time.monotonic() + STOP_GRACE
        with self.cv:
            try:
                while self._pending(exec_id, targets) and time.monotonic() < end:
                    self.cv.wait(max(end - time.monotonic(), 0.001))
            except KeyboardInterrupt:
                pass
            got = dict(self._results.get(exec_id, {}))
            silent = self._pending(exec_id, targets)
        sent = self._sent.get(exec_id, {})
        failures = []
        for r in targets:
            res, info = got.get(r), sent.get(r) or self.ranks[r]
            if res is not None and res.status != "ok":
                failures.append(RankFailure(r, info.name, res.error_type, res.error,
                                            res.traceback))
            elif res is None and r not in silent:
                failures.append(RankFailure(r, info.name, "WorkerDiedError", info.reason(), ""))
        if failures:
            self.last_failed = failures[0].rank  # %dist_debug: pdb where it stopped
        return CellInterrupted(failures, [self.ranks[r].label() for r in silent])

    def pending(self, exec_id: int, targets: list[int]) -> list[int]:
        """The targets that may still answer cell ``exec_id`` (a look; nothing is waited for)."""
        with self.cv:
            return self._pending(exec_id, targets)

    def first_failure(self, exec_id: int, targets: list[int]) -> int | None:
        """The target that failed cell ``exec_id`` first (raised, or its process ended), if
        any yet (a look; nothing is waited for)."""
        with self.cv:
            got, sent = self._results.get(exec_id, {}), self._sent.get(exec_id, {})
            when = self._finished.get(exec_id, {})
            raised = [r for r in targets if r in got and got[r].status == "error"]
            if raised:
                return min(raised, key=lambda r: when.get(r, 0.0))
            return next((r for r in targets if r not in got and not self._answers(sent, r)),
                        None)

    def _pending(self, exec_id: int, targets: list[int]) -> list[int]:
        got = self._results.get(exec_id, {})
        sent = self._sent.get(exec_id, {})
        return [r for r in targets if r not in got and self._answers(sent, r)]

    def _answers(self, sent: dict[int, RankInfo], r: int) -> bool:
        """Whether the process the cell went to may still answer it: alive, and not
        replaced or stopped by a keep-restart since."""
        now = self.ranks.get(r)
        was = sent.get(r, now)
        return was is not None and was is now and was.alive

    def _wait(self, exec_id: int, targets: list[int], deadline: float | None,
              partial: bool = False, announce: bool = True) -> dict:
        with self.desk.waiting():
            return self._wait_serving(exec_id, targets, deadline, partial, announce)

    def _wait_serving(self, exec_id: int, targets: list[int], deadline: float | None,
                      partial: bool, announce: bool) -> dict:
        started = time.monotonic()
        status: StatusLine | None = None
        next_status = started + StatusLine.AFTER
        announced: set[int] = set()
        said: set[tuple[str, str]] = set()  # the errors already shown, for this cell
        with self.cv:
            while True:
                pending = self._pending(exec_id, targets)
                now = time.monotonic()
                if pending and announce and not partial:  # (partial: others interrupted)
                    self._announce_failures(exec_id, announced, said)
                if not pending:
                    if status is not None:
                        status.done(self._summary(exec_id, targets, started))
                    got = CellResults(self._results.get(exec_id, {}))
                    for r in targets:
                        got.setdefault(r, None)  # None: the rank died
                    got.sent = self._sent.pop(exec_id, {})
                    got.finished = dict(self._finished.get(exec_id, {}))
                    return got
                if now >= next_status:
                    status = status or StatusLine()
                    names = _names([self.ranks[r].name for r in pending])
                    status.show(f"nbdist: running on {names} ({now - started:.1f}s)")
                    next_status = now + StatusLine.EVERY
                if deadline is not None and time.monotonic() > deadline:
                    self.interrupt(pending)
                    if partial:
                        got = CellResults(self._results.get(exec_id, {}))
                        got.sent = dict(self._sent.get(exec_id, {}))
                        got.finished = dict(self._finished.get(exec_id, {}))
                        return got
                    who = ", ".join(self.ranks[r].label() for r in pending) \
                        if len(pending) <= SMALL else \
                        labels((r, self.ranks[r].name) for r in pending)
                    raise DistTimeoutError(f"timed out waiting for {who} to finish the cell; "
                                           "they were interrupted")
                self.cv.wait(0.05)
                if self.desk.has_prompts():  # a worker's debugger waits for the user
                    self.cv.release()
                    try:
                        self.desk.serve()
                    finally:
                        self.cv.acquire()

    def _announce_failures(self, exec_id: int, announced: set[int],
                           said: set[tuple[str, str]]) -> None:
        """A rank's error shows the moment it arrives, while the others run on (its full
        traceback comes with the cell's end); ranks whose errors arrived together with the
        same type and message share one line, and an error already shown in this cell is not
        shown again as more ranks raise it (the cell's error names them all: 63 ranks
        raising one error in 17 batches were 17 lines)."""
        new = [(r, res) for r, res in self._results.get(exec_id, {}).items()
               if res.status == "error" and r not in announced]
        announced.update(r for r, _ in new)
        for (etype, error), same in grouped(new, lambda item: (item[1].error_type,
                                                                item[1].error)):
            if (etype, error) in said:
                continue
            said.add((etype, error))
            ranks = [r for r, _ in same]
            who = self.ranks[ranks[0]].label() if len(ranks) == 1 else \
                named((r, self.ranks[r].name) for r in ranks)
            Router.write("stderr", f"nbdist: {who} failed: {etype}: {error} "
                                   "(the others run on)\n")

    def _summary(self, exec_id: int, targets: list[int], started: float) -> str:
        done = self._finished.get(exec_id, {})
        if len(targets) > SMALL:
            return "nbdist: finished: " + _spread(
                {self.ranks[r].name: done[r] - started for r in targets if r in done},
                [self.ranks[r].name for r in targets if r not in done])
        parts = [f"{self.ranks[r].name} {done[r] - started:.1f}s" if r in done else
                 f"{self.ranks[r].name} ended" for r in targets]
        return "nbdist: finished: " + ", ".join(parts)

    def report(self, results: dict, targets: list[int], show: bool = True) -> dict:
        """Print each rank's value as ``[name] value``; raise ``DistCellError`` for failures."""
        values: dict[int, str | None] = {}
        failures: list[RankFailure] = []
        sent = getattr(results, "sent", {})
        finished = getattr(results, "finished", {})
        hints: set[str] = set()
        for r in sorted(targets, key=lambda r: finished.get(r, float("inf"))):  # first first
            res: Result | None = results[r]
            info = sent.get(r) or self.ranks[r]
            if res is None:
                reason = info.reason() if not info.alive else "was stopped by a restart"
                failures.append(RankFailure(r, info.name, "WorkerDiedError", reason,
                                            f"{info.label()} {reason} while running the cell\n"))
            elif res.status == "ok":
                values[r] = res.value
                if show and res.value is not None and \
                        not self.rich.took_result(res.exec_id, r):
                    body = res.value.replace("\n", f"\n[{info.name}] ")
                    print(f"[{info.name}] {body}")
            else:
                hint = where_defined(res.error_type, res.error)
                hint = "" if hint in hints else hint  # once per cell
                hints.add(hint)
                failures.append(RankFailure(r, info.name, res.error_type, res.error,
                                            res.traceback + hint))
        if failures:
            self.last_failed = failures[-1].rank
            raise DistCellError(failures, f"the cell failed on {ranks_named(failures)}: ")
        return {r: values[r] for r in targets if r in values}  # by rank, whoever finished first

    def flush(self, timeout: float) -> bool:
        """Wait until what live workers printed or logged so far has arrived here."""
        token = self.next_id()
        targets = self.send_all([r for r in self.ranks if r], Flush(token))
        deadline = time.monotonic() + timeout
        with self.cv:
            try:
                while True:
                    done = self._flushed.get(token, set())
                    if all(r in done or not self.ranks[r].alive for r in targets):
                        return True
                    if time.monotonic() > deadline:
                        return False
                    self.cv.wait(0.02)
            finally:
                self._flushed.pop(token, None)


def _names(names: list[str]) -> str:
    """Names one by one up to ``SMALL`` of them, past it written compactly."""
    return ", ".join(names) if len(names) <= SMALL else rank_set(names)


def _spread(took: dict[str, float], ended: list[str]) -> str:
    """Many ranks' times as one line: ``worker1-255 in 0.1-0.4s (slowest worker17)``,
    then the ranks that ended without finishing."""
    parts = []
    if took:
        slowest = max(took, key=took.__getitem__)
        parts.append(f"{rank_set(took)} in {min(took.values()):.1f}-{took[slowest]:.1f}s "
                     f"(slowest {slowest})")
    if ended:
        parts.append(f"{rank_set(ended)} ended")
    return ", ".join(parts)
