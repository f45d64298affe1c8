"""Views: worker ranks addressed as one (``c[:]``, ``c[1:3]``, ``c[[1, 3]]``, ``c["obs2"]``).

A call through a view sends one RPC per rank at once (``rpc_async`` to each, then one wait
for all; a call, push or pull reaches the ranks of another host in one frame to its join
agent, each rank running it as an RPC function: ``relayed_calls``) and returns ``{rank:
value}`` of real objects: notebook functions and classes travel by value and large CPU
tensors between local ranks over shared memory, as every RPC does here.
Rank 0, the notebook, is in no view: ``c[:]`` is every worker. A rank that raises or dies is
reported with its traceback and name in one ``DistCallError`` once every rank has answered;
the others' values are on its ``results``. Ctrl-C ends the wait and interrupts the call on
every rank still running it. A world without RPC (``--no-rpc``) refuses with ``NoRpcError``.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import DistCallError, RankFailure, WorkerDiedError, ranks_named, safe_str
from ..patches import no_rpc
from ..patches.rpc_hooks import wait_future
from ..proc.namespace import apply_each, assign, read
from ..rank_sets import SMALL, rank_set
from ..spec import parse_ranks
from .lifecycle import ClusterState

if TYPE_CHECKING:
    from .world import World

__all__ = ["CallFuture", "Load", "View", "join", "select", "split"]


def select(key: Any, names: list[str]) -> list[int]:
    """The worker ranks ``key`` names in a world of ``names``: a slice of rank numbers
    (``[:]`` every worker, ``[1:3]`` ranks 1 and 2), a rank, a name, or a list of those."""
    if isinstance(key, slice):
        numbers = range(len(names))
        start = key.start
        if start is not None and -len(names) <= start < len(names) and numbers[start] == 0:
            raise ValueError("rank 0 is the notebook itself: a view holds workers only "
                             "(c[1:] or c[:] is every worker)")
        chosen = [r for r in numbers[key] if r != 0]
        if not chosen:
            raise ValueError(f"c[{_slice_text(key)}] selects no worker; this world has "
                             f"workers 1..{len(names) - 1}")
        return chosen
    if key is None or isinstance(key, bool):
        raise TypeError(f"index a cluster with ranks, names or a slice, not {key!r}")
    return parse_ranks(list(key) if isinstance(key, (list, tuple, set, range)) else key, names)


def _slice_text(key: slice) -> str:
    text = ":".join("" if v is None else str(v) for v in (key.start, key.stop, key.step))
    return text.removesuffix(":")


def split(seq: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    """``seq`` cut into ``parts`` contiguous pieces whose lengths differ by at most one, the
    longer first (ipyparallel's scatter); a tensor's pieces are copies, not views of it."""
    n = len(seq)
    base, extra = divmod(n, parts)
    out = []
    lo = 0
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        piece = seq[lo:hi]
        if hasattr(piece, "clone") and hasattr(piece, "untyped_storage"):
            piece = piece.clone()  # a view would send its whole storage
        out.append(piece)
        lo = hi
    return out


def join(pieces: list[Any]) -> Any:
    """Pieces from ``gather`` joined in rank order: tensors by ``torch.cat``, arrays by
    ``numpy.concatenate``, anything else into one list."""
    if pieces and all(hasattr(p, "untyped_storage") for p in pieces):
        import torch

        return torch.cat(pieces)
    if pieces and all(type(p).__module__ == "numpy" and hasattr(p, "ndim") for p in pieces):
        import numpy

        return numpy.concatenate(pieces)
    return list(itertools.chain.from_iterable(pieces))


class Load:
    """View calls in flight per rank, as this notebook sent them; ``choose`` asks it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: Counter[int] = Counter()
        self._turn = itertools.count()

    def begin(self, rank: int) -> None:
        with self._lock:
            self._busy[rank] += 1

    def end(self, rank: int) -> None:
        with self._lock:
            self._busy[rank] -= 1

    def least(self, ranks: Sequence[int]) -> int:
        """The rank of ``ranks`` with the fewest calls in flight; ties take turns."""
        with self._lock:
            low = min(self._busy[r] for r in ranks)
            idle = [r for r in ranks if self._busy[r] == low]
            return idle[next(self._turn) % len(idle)]


class CallFuture:
    """One view call under way; ``result()`` waits for every rank's answer.

    The wait can be interrupted (Ctrl-C interrupts the call on each rank still running it) and
    ends early for a rank that dies. Results are kept: ``result()`` may be called again.
    """

    def __init__(self, world: World, what: str, futures: dict[int, Any],
                 failures: dict[int, RankFailure], timeout: float) -> None:
        self._world, self.what, self._timeout = world, what, timeout
        self._futures, self._failures = futures, failures
        self._values: dict[int, Any] | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted([*self._futures, *self._failures])

    def done(self) -> bool:
        """Whether every rank has answered (a rank that died before the call counts)."""
        return all(f.done() for f in self._futures.values())

    def result(self) -> dict[int, Any]:
        """``{rank: value}``; raises ``DistCallError`` naming every rank that failed."""
        if self._values is None:
            self._values = self._collect()
        if self._failures:
            failures = [self._failures[r] for r in sorted(self._failures)]
            raise DistCallError(failures, f"{self.what} failed on {ranks_named(failures)}: ",
                                results=dict(self._values))
        return dict(self._values)

    wait = result

    def _collect(self) -> dict[int, Any]:
        world, values = self._world, {}
        waiting = None
        try:
            for r, fut in sorted(self._futures.items()):
                waiting = r
                name = world.names[r]
                try:
                    values[r] = wait_future(fut, name)
                except WorkerDiedError as exc:
                    self._failures[r] = _died(world, r, exc.reason, self.what)
                except Exception as exc:  # noqa: BLE001 - the rank's failure, reported whole
                    if _TIMED_OUT in safe_str(exc):  # as %%dist --timeout: its work stops too
                        world.interrupted(r, fut)
                        self._failures[r] = _timed_out(world, r, self.what, self._timeout)
                    else:
                        self._failures[r] = _failure(r, name, exc)
            waiting = None
        except KeyboardInterrupt:  # wait_future told ``waiting`` itself
            world.interrupted_all({r: fut for r, fut in self._futures.items()
                                   if r != waiting and not fut.done()})
            raise
        for r in self._futures:
            world.replied(r)  # what the ranks printed shows before the caller goes on
        return values


_TIMED_OUT = "ran for more than set timeout"  # torch's words for an RPC past its deadline


def _timed_out(world: World, rank: int, what: str, seconds: float) -> RankFailure:
    info = world.ranks[rank]
    why = f"no answer within {seconds:g} s; its call there was interrupted"
    return RankFailure(rank, info.name, "DistTimeoutError", why,
                       f"{info.label()}: {why} (running {what})\n")


def _died(world: World, rank: int, reason: str, what: str) -> RankFailure:
    info = world.ranks[rank]
    return RankFailure(rank, info.name, "WorkerDiedError", reason,
                       f"{info.label()} {reason} while running {what}\n")


def _failure(rank: int, name: str, exc: BaseException) -> RankFailure:
    """What a rank raised, from the exception torch re-created here: its type, message and
    the rank's own traceback (torch puts it in the message after ``On WorkerInfo(...)``)."""
    text = safe_str(exc)
    try:  # torch decodes the remote message as unicode_escape: undo it for non-ASCII text
        text = text.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    text = text.split("\n\nAt:\n", 1)[0]  # the C++ frames torch appends
    found = _REMOTE.match(text)
    if found is None:  # not the rank's own exception: a timeout, a closed pipe, ...
        etype = type(exc).__name__
        return RankFailure(rank, name, etype, text, f"{etype}: {text}\n")
    # torch re-raises a type it cannot rebuild here as RuntimeError("Type: On WorkerInfo...")
    etype = found.group(1) or type(exc).__name__
    rest = text[found.end():]
    start = rest.find("Traceback (most recent call last)")
    tb = (rest[start:] if start >= 0 else rest).rstrip("\n") + "\n"
    last = tb.rstrip("\n").rsplit("\n", 1)[-1]
    message = last.partition(": ")[2] if last.startswith(etype) else last
    return RankFailure(rank, name, etype, message, tb)


_REMOTE = re.compile(r"(?:([\w.]+): )?On WorkerInfo\([^)]*\):\n")


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


class View:
    """Worker ranks addressed as one; made by indexing a cluster (``c[:]``, ``c[1:3]``).

    ``timeout``: seconds each call may take on a rank (None: the world's ``--rpc-timeout``);
    a rank past it is interrupted and reported as a ``DistTimeoutError`` failure.
    """

    def __init__(self, world: Callable[[], World], ranks: Sequence[int], load: Load,
                 timeout: float | None = None) -> None:
        self._world, self._load = world, load
        self.ranks = list(ranks)
        self.timeout = timeout

    @property
    def names(self) -> list[str]:
        names = self._world().names
        return [names[r] if r < len(names) else f"rank{r}" for r in self.ranks]

    def __len__(self) -> int:
        return len(self.ranks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.ranks)

    def __repr__(self) -> str:
        return f"<nbdist.View {', '.join(self.names)}>"

    # ------------------------------------------------------------------ calls
    def call_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CallFuture:
        """Start ``fn(*args, **kwargs)`` on every rank of the view; returns at once."""
        return self._send(f"{_fn_name(fn)} on {self._label()}",
                          {r: (fn, args, kwargs) for r in self.ranks}, same=True)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[int, Any]:
        """``fn(*args, **kwargs)`` on every rank of the view at once -> ``{rank: value}``."""
        return self.call_async(fn, *args, **kwargs).result()

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        """``[fn(x) for x in items]``, the items cut into one contiguous share per rank."""
        items = list(items)
        shares = split(items, len(self.ranks))
        calls = {r: (apply_each, (fn, share), {})
                 for r, share in zip(self.ranks, shares, strict=True) if share}
        if not calls:
            return []
        out = self._send(f"map of {_fn_name(fn)} on {self._label()}", calls).result()
        return [y for r in sorted(out) for y in out[r]]

    def choose(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on one rank of the view: the live one with the fewest
        calls in flight from this notebook (ties take turns); returns its value."""
        world = self._world()
        live = [r for r in self.ranks if r in world.ranks and world.ranks[r].alive]
        rank = self._load.least(live or self.ranks)
        return self._send(f"{_fn_name(fn)} on {world.names[rank]}",
                          {rank: (fn, args, kwargs)}).result()[rank]

    # ------------------------------------------------------------------ data
    def push(self, values: dict[str, Any]) -> None:
        """Bind each name of ``values`` in the ``__main__`` of every rank of the view."""
        bad = [k for k in values if not (isinstance(k, str) and k.isidentifier())]
        if bad:
            raise ValueError(f"push takes names of variables as keys, not {bad[0]!r}")
        pushed = (assign, (dict(values),), {})
        self._send(f"push to {self._label()}", {r: pushed for r in self.ranks},
                   same=True).result()

    def pull(self, names: str | Sequence[str]) -> dict[int, Any]:
        """``{rank: value}`` of a name in each rank's ``__main__`` (several names: tuples)."""
        wanted = names if isinstance(names, str) else tuple(names)
        pulled = (read, (wanted,), {})
        return self._send(f"pull from {self._label()}", {r: pulled for r in self.ranks},
                          same=True).result()

    def scatter(self, name: str, seq: Sequence[Any]) -> None:
        """Bind ``name`` on each rank to its contiguous share of ``seq``, in rank order."""
        shares = split(seq, len(self.ranks))
        self._send(f"scatter to {self._label()}",
                   {r: (assign, ({name: share},), {})
                    for r, share in zip(self.ranks, shares, strict=True)}).result()

    def gather(self, name: str) -> Any:
        """The ranks' values of ``name`` joined in rank order (the reverse of ``scatter``)."""
        pulled = self.pull(name)
        return join([pulled[r] for r in self.ranks])

    def __setitem__(self, name: str, value: Any) -> None:
        self.push({name: value})

    def __getitem__(self, name: str) -> dict[int, Any]:
        if not isinstance(name, str):
            raise TypeError(f"a view's [...] takes a variable name, not {name!r}; pick ranks "
                            "on the cluster instead: c[[1, 3]], c[1:3]")
        return self.pull(name)

    # ------------------------------------------------------------------ sending
    def _label(self) -> str:
        return ", ".join(self.names) if len(self.names) <= SMALL else rank_set(self.names)

    def _send(self, what: str, calls: dict[int, tuple], same: bool = False) -> CallFuture:
        """One ``rpc_async`` per rank, all sent before any is waited for; ``same`` (one call
        for every rank): the ranks of another host get it in one frame through its agent
        (``relayed_calls``)."""
        no_rpc.check("a view's call")
        world = self._world()
        world.state.require(ClusterState.RUNNING, doing="call through a view")
        import torch.distributed.rpc as rpc
        from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

        timeout = UNSET_RPC_TIMEOUT if self.timeout is None else self.timeout
        seconds = world.spec.rpc_timeout if self.timeout is None else self.timeout
        futures: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        relayed = self._relayed(world, calls) if same else []
        payload = world.cells.calls.pickled(calls[relayed[0]]) if relayed else None
        if payload is not None:
            futures.update(world.cells.calls.send(relayed, payload, seconds))
            for r in relayed:
                self._load.begin(r)
                futures[r].add_done_callback(lambda _f, r=r: self._load.end(r))
        for r, (fn, args, kwargs) in calls.items():
            if r in futures:
                continue
            info = world.ranks.get(r)
            if info is None:
                raise ValueError(f"no rank {r} in this world: it has workers "
                                 f"1..{len(world.names) - 1}")
            if not info.alive:
                failures[r] = _died(world, r, info.reason(), what)
                continue
            fut = rpc.rpc_async(info.name, fn, args=args, kwargs=kwargs, timeout=timeout)
            self._load.begin(r)
            fut.add_done_callback(lambda _f, r=r: self._load.end(r))
            futures[r] = fut
        return CallFuture(world, what, dict(sorted(futures.items())), failures, seconds)

    @staticmethod
    def _relayed(world: World, calls: dict[int, tuple]) -> list[int]:
        """The ranks of ``calls`` a join agent relays to (live ones on other hosts)."""
        agent_of = world.cells.agent_of
        if agent_of is None:
            return []
        return [r for r in calls if r in world.ranks and world.ranks[r].alive
                and agent_of(world.ranks[r]) is not None]
