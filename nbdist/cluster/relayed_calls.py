"""A view's call to ranks on other hosts through their join agents: the call pickled once,
one ``Call`` frame per host, a torch ``Future`` per rank completed by its ``Returned``. A
call only RPC can carry (an ``RRef`` in it: ``pickled`` says None) goes as an RPC to each.

The futures are the ones ``views.CallFuture`` waits on for ``rpc_async``'s, so waiting,
Ctrl-C, a dead rank and the error a rank raised read as for a call over RPC. A rank that does
not answer within the call's timeout, counted from the send as torch's caller counts it,
fails with torch's words for a timeout (a timeout of 0: none, as torch's); the rank runs the
function itself and keeps no clock of its own.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..control.protocol import Call, Message, Returned
from ..errors import WorkerDiedError
from ..rank_info import RankInfo
from ..shipping.pickler import dumps

__all__ = ["TIMED_OUT", "RelayedCalls"]

TIMED_OUT = "ran for more than set timeout"  # torch's words, which views.CallFuture reads


class RelayedCalls:
    """Relayed view calls waiting for their ranks' answers."""

    def __init__(self, ranks: dict[int, RankInfo], ids: Iterator[int],
                 send_all: Callable[[list[int], Message], list[int]]) -> None:
        self._ranks, self._ids, self._send_all = ranks, ids, send_all
        self._lock = threading.Lock()
        self._waiting: dict[tuple[int, int], Any] = {}  # (call id, rank) -> its Future
        self._timers: dict[int, tuple[threading.Timer | None, int]] = {}  # call id -> (its
        # timer, how many of its ranks have not answered)

    @staticmethod
    def pickled(call: tuple) -> bytes | None:
        """``call`` pickled for the relay; None when only an RPC can carry it (an RRef)."""
        try:
            return dumps(call)
        except Exception:  # noqa: BLE001 - the RPC path pickles it, or says why not
            return None

    def send(self, ranks: list[int], payload: bytes, timeout: float) -> dict[int, Any]:
        """Start the call ``payload`` pickles (``pickled``) on ``ranks``; returns rank ->
        Future."""
        import torch

        call_id = next(self._ids)
        futures = {r: torch.futures.Future() for r in ranks}
        timer = None
        if timeout > 0:
            timer = threading.Timer(timeout, self._expire, (call_id, ranks, timeout))
            timer.daemon = True
        with self._lock:
            for r, fut in futures.items():
                self._waiting[(call_id, r)] = fut
            self._timers[call_id] = (timer, len(ranks))
        if timer is not None:
            timer.start()
        reached = set(self._send_all(ranks, Call(call_id, payload, timeout)))
        for r in ranks:
            if r not in reached:
                info = self._ranks[r]
                self._fail(call_id, r, WorkerDiedError(r, info.name, info.reason(),
                                                       "a view's call was sent"))
        return futures

    def _take(self, call_id: int, rank: int) -> Any:
        """The future of ``rank``'s part of the call (None: done already); the call's timer
        stops with its last part."""
        with self._lock:
            fut = self._waiting.pop((call_id, rank), None)
            if fut is not None:
                timer, left = self._timers.pop(call_id, (None, 0))
                if left > 1:
                    self._timers[call_id] = (timer, left - 1)  # type: ignore[assignment]
                elif timer is not None:
                    timer.cancel()
        return fut

    def returned(self, msg: Returned) -> None:
        """A rank's answer (the receiver's thread): its future completes."""
        fut = self._take(msg.call_id, msg.rank)
        if fut is None:
            return  # timed out here already
        if msg.status != "ok":
            text = msg.error
            if text.startswith("On WorkerInfo"):  # torch's remote text names no type first
                text = f"{msg.error_type}: {text}"
            fut.set_exception(RuntimeError(text))
            return
        try:
            value = pickle.loads(msg.payload)
        except Exception as exc:  # noqa: BLE001 - the caller's to see
            fut.set_exception(exc)
            return
        fut.set_result(value)

    def _expire(self, call_id: int, ranks: list[int], timeout: float) -> None:
        for r in ranks:
            self._fail(call_id, r, RuntimeError(f"the call on rank {r} {TIMED_OUT} "
                                                f"({timeout:g} s)"))

    def _fail(self, call_id: int, rank: int, exc: BaseException) -> None:
        fut = self._take(call_id, rank)
        if fut is not None:
            fut.set_exception(exc)

    def died(self, rank: int) -> None:
        """``rank`` ended: its calls fail (``CallFuture.done`` is not kept waiting)."""
        info = self._ranks.get(rank)
        with self._lock:
            gone = [k for k in self._waiting if k[1] == rank]
        for call_id, r in gone:
            self._fail(call_id, r, WorkerDiedError(r, info.name if info else f"rank{r}",
                                                   info.reason() if info else "gone",
                                                   "a view's call ran"))
