"""``nbdist.log`` on any rank, and the history the notebook keeps of it.

A record is a dict: ``rank``, ``name`` (the rank's RPC name), ``step``, ``time`` (wall clock,
``time.time()`` when logged) and the logged values.

Worker side: ``log`` appends ``(step, time, values)`` to a ``deque`` (``append`` is atomic;
``values`` is the call's own keyword dict), and a background thread sends what accumulated to
the notebook every 50 ms, in batches of at most ``BATCH_ROWS`` rows, so a tight logging loop
costs well under a microsecond a call. The queue is bounded (``MAX_PENDING``): when it is
full, ``log`` waits for the flusher (back-pressure) instead of dropping records. Taking a batch
and sending it happen under one lock, and the worker also flushes before it reports a
``%%dist`` cell's result, so records of one rank arrive in order and before the cell's result.

Values other than ``float``, ``int``, ``str``, ``bool`` and ``None`` travel as an ``Opaque``:
the value pickled on the worker plus its ``repr``. The notebook unpickles it when the batch is
delivered and keeps the ``repr`` string when it cannot (a lock, a class only the worker has).

Notebook side: the history is stored by column (``Table``): per record a rank, a name
index, a step and a time in ``array`` columns; per value name the indices of the records
that carry it and their values (an ``array('d')``/``array('q')`` while they are all floats
or all ints, a list otherwise): about 40 bytes a record of one float. Subscribers
(``subscribe``) are called with each delivered batch as record dicts.

Batches also carry *internal* records (a ``"__nbdist__"`` key: RPC traces, benchmark timings);
``deliver`` hands those to their handler (``register_internal``) and never puts them in the
history.
"""

from __future__ import annotations

import collections
import csv
import json
import pickle
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "Opaque",
    "Table",
    "clear_history",
    "deliver",
    "export_history",
    "flush_worker",
    "follow",
    "follow_with",
    "generation",
    "history",
    "history_frame",
    "identity",
    "is_worker",
    "log",
    "record_count",
    "register_internal",
    "send_internal",
    "set_identity",
    "start_worker_flusher",
    "subscribe",
    "unsubscribe",
]

META = ("rank", "name", "step", "time")
INTERNAL = "__nbdist__"
MAX_PENDING = 100_000  # records a worker holds before log() waits for the flusher
BATCH_ROWS = 20_000  # rows per metrics message
STALL_SECONDS = 5.0  # log() stops waiting when the flusher made no progress for this long
REPR_CHARS = 200  # an Opaque's repr is cut to this length

_lock = threading.Lock()
_subscribers: list[Callable[[list[dict]], None]] = []
_internal: dict[str, Callable[[dict], None]] = {}  # kind -> handler (register_internal)
_rank = 0
_name = "worker0"
_generation = 0  # bumped by clear_history, so displays know to start over
_next_step = 0

# worker side
_pending: collections.deque = collections.deque()
_pending_internal: collections.deque = collections.deque()
_send_lock = threading.Lock()
_extra_sources: list[Callable[[], list[dict]]] = []
_worker = False
_sent = 0  # rows the flusher has taken so far (log() watches it while it waits)
_FLUSH_EVERY = 0.05
_PLAIN = frozenset((float, int, str, bool, type(None)))
_RESERVED = frozenset(("rank", "name", "time"))
_append = _pending.append
_now = time.time


class Opaque:
    """A logged value that is not plain data, as it crosses from a worker: pickle and repr."""

    __slots__ = ("data", "text")

    def __init__(self, data: bytes | None, text: str) -> None:
        self.data, self.text = data, text

    @classmethod
    def wrap(cls, value: Any) -> Opaque:
        """``value`` pickled (``data`` None if it cannot be) with its repr."""
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - a repr that raises is still a value
            text = f"<{type(value).__name__} (repr failed: {exc})>"
        if len(text) > REPR_CHARS:
            text = text[: REPR_CHARS - 3] + "..."
        try:
            data: bytes | None = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - locks, sockets, generators...
            data = None
        return cls(data, text)

    def unwrap(self) -> Any:
        """The value again, or its repr string where it cannot be rebuilt here."""
        if self.data is not None:
            try:
                return pickle.loads(self.data)
            except Exception:  # noqa: BLE001 - a class this process lacks, and the like
                pass
        return self.text

    def __getstate__(self) -> tuple:
        return self.data, self.text

    def __setstate__(self, state: tuple) -> None:
        self.data, self.text = state

    def __repr__(self) -> str:
        return f"Opaque({self.text})"


# ---------------------------------------------------------------------------- the history
class _Column:
    """One value name: indices of the records that carry it and their values."""

    __slots__ = ("idx", "vals")

    def __init__(self) -> None:
        self.idx = array("q")
        self.vals: Any = None  # array('d'), array('q') or list, chosen by the first value

    def add(self, i: int, v: Any) -> None:
        vals = self.vals
        t = type(v)
        if vals is None:
            vals = self.vals = array("d") if t is float else array("q") if t is int else []
        elif type(vals) is array and t is not (float if vals.typecode == "d" else int):
            vals = self.vals = list(vals)
        try:
            vals.append(v)
        except OverflowError:  # an int beyond 64 bits
            vals = self.vals = list(vals)
            vals.append(v)
        self.idx.append(i)


class Table:
    """Every record received, column by column (see the module docstring)."""

    def __init__(self) -> None:
        self.ranks = array("i")
        self.name_ids = array("i")
        self.steps = array("q")
        self.times = array("d")
        self.columns: dict[str, _Column] = {}
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, rank: int, name: str, step: int, t: float, values: dict) -> None:
        nid = self._name_ids.get(name)
        if nid is None:
            nid = self._name_ids[name] = len(self.names)
            self.names.append(name)
        i = len(self.steps)
        self.steps.append(step)  # first: a step that is not a whole number fails here, alone
        self.ranks.append(rank)
        self.name_ids.append(nid)
        self.times.append(t)
        cols = self.columns
        for key, v in values.items():
            col = cols.get(key)
            if col is None:
                col = cols[key] = _Column()
            col.add(i, v)

    def select(self, rank: int | None, key: str | None) -> list[int]:
        """Indices of the records of ``rank`` carrying ``key`` (None: any)."""
        if key is not None:
            col = self.columns.get(key)
            sel: Iterable[int] = col.idx if col is not None else ()
        else:
            sel = range(len(self.steps))
        if rank is not None:
            ranks = self.ranks
            return [i for i in sel if ranks[i] == rank]
        return list(sel)

    def last_names(self) -> dict[int, str]:
        """``{rank: the name its latest record carries}``."""
        latest = dict(zip(self.ranks, self.name_ids, strict=True))
        return {r: self.names[nid] for r, nid in latest.items()}

    def numeric_curves(self, skip: Iterable[str] = ()) -> Iterator[tuple[str, int, Any, Any]]:
        """``(key, rank, steps, values)`` numpy arrays of every number logged, per value
        name and rank (records carrying a name in ``skip`` left out)."""
        import numpy as np

        skipped: set[int] = set()
        for key in skip:
            if key in self.columns:
                skipped.update(self.columns[key].idx)
        ranks = np.array(self.ranks, dtype=np.int64)
        steps = np.array(self.steps, dtype=np.int64)
        for key, col in self.columns.items():
            if key in skip:
                continue
            if type(col.vals) is list:
                pairs = [(i, v) for i, v in zip(col.idx, col.vals, strict=True)
                         if type(v) in (int, float)]
                idx = np.array([i for i, _ in pairs], dtype=np.int64)
                vals = np.array([v for _, v in pairs], dtype=np.float64)
            else:
                idx = np.array(col.idx, dtype=np.int64)
                vals = np.array(col.vals, dtype=np.float64)
            if skipped and idx.size:
                keep = ~np.isin(idx, np.fromiter(skipped, np.int64, len(skipped)))
                idx, vals = idx[keep], vals[keep]
            col_ranks = ranks[idx]
            for r in np.unique(col_ranks).tolist():
                mask = col_ranks == r
                yield key, r, steps[idx[mask]], vals[mask]

    def rows(self, sel: list[int]) -> list[dict]:
        """The records at indices ``sel`` (ascending) as new dicts."""
        ranks, nids, steps, times, names = (self.ranks, self.name_ids, self.steps, self.times,
                                            self.names)
        out = [{"rank": ranks[i], "name": names[nids[i]], "step": steps[i], "time": times[i]}
               for i in sel]
        everything = len(sel) == len(steps)
        pos = None if everything else {i: n for n, i in enumerate(sel)}
        for key, col in self.columns.items():
            if everything:
                for i, v in zip(col.idx, col.vals, strict=True):
                    out[i][key] = v
                continue
            for i, v in zip(col.idx, col.vals, strict=True):
                n = pos.get(i)  # type: ignore[union-attr]
                if n is not None:
                    out[n][key] = v
        return out


_table = Table()


def log(step: int | None = None, **values: Any) -> None:
    """Record named values (numbers, usually) from whatever rank and thread runs this.

    ``step`` defaults to a per-process counter (one past the last step logged here; give it
    explicitly when several threads log the same series). Tensors and numpy scalars of one
    element become Python numbers; other values that are not plain data reach the notebook
    as themselves when they can be pickled and rebuilt there, else as their ``repr``.
    ``rank``, ``name`` and ``time`` are reserved names.
    """
    global _next_step
    if not values:
        raise ValueError("nbdist.log() needs at least one named value, e.g. log(reward=1.5)")
    for v in values.values():
        if type(v) not in _PLAIN:
            _convert(values)
            break
    if not _RESERVED.isdisjoint(values):
        raise ValueError(f"nbdist.log(): {sorted(_RESERVED & set(values))} are reserved names; "
                         "pick other names for those values")
    if step is None:
        step = _next_step
    elif type(step) is not int:
        step = int(step)
    _next_step = step + 1
    if _worker:
        if len(_pending) >= MAX_PENDING:
            _wait_for_room()
        _append((step, _now(), values))  # the kwargs dict is ours: no copy
    else:
        deliver([_record(_rank, _name, step, _now(), values)])


def _wait_for_room() -> None:
    """Back-pressure: sleep until the flusher took rows, giving up only when it stalls."""
    seen, stalled_at = _sent, time.monotonic()
    while len(_pending) >= MAX_PENDING:
        time.sleep(0.002)
        if _sent != seen:
            seen, stalled_at = _sent, time.monotonic()
        elif time.monotonic() - stalled_at > STALL_SECONDS:
            return  # the flusher is stuck (the notebook is gone?): keep the record anyway


def _record(rank: int, name: str, step: int, t: float, values: dict) -> dict:
    rec = {"rank": rank, "name": name, "step": step, "time": t}
    rec.update(values)
    return rec


def _convert(values: dict) -> None:
    for key, v in values.items():
        if type(v) not in _PLAIN:
            v = _plain(v)
            if _worker and type(v) not in _PLAIN:
                v = Opaque.wrap(v)
            values[key] = v


def _plain(v: Any) -> Any:
    """A one-element tensor or numpy value as a Python number; anything else unchanged."""
    item = getattr(v, "item", None)
    if item is not None:
        try:
            size = v.numel() if hasattr(v, "numel") else getattr(v, "size", 1)
            if size == 1:
                return item()
        except Exception:  # noqa: BLE001 - not a number-like after all
            return v
    return v


def _unwrap(values: dict) -> dict:
    for key, v in values.items():
        if type(v) is Opaque:
            values[key] = v.unwrap()
    return values


def deliver(records: Any) -> None:
    """Rank 0: add records to the history and tell the subscribers (internal records aside).

    ``records`` is a list of record dicts (internal ones, if any, at its end), or a worker's
    batch as ``flush_worker`` packs it: ``(rank, name, [(step, time, values), ...],
    [internal records])``.
    """
    if type(records) is tuple:
        rank, name, rows, specials = records
    else:
        rows, specials = _split_internal(records)
        rank = name = None
    _handle_internal(specials)
    if rows:
        _store(rank, name, rows)


def _split_internal(records: list[dict]) -> tuple[list, list]:
    k = len(records)
    while k and INTERNAL in records[k - 1]:
        k -= 1
    return records[:k], records[k:]


def _handle_internal(specials: Iterable[dict]) -> None:
    for special in specials:
        handler = _handler(special[INTERNAL])
        if handler is not None:
            try:
                handler(special)
            except Exception:  # noqa: BLE001 - a broken handler must not break logging
                pass


def _store(rank: int | None, name: str | None, rows: list) -> None:
    """Append ``rows`` (worker rows of ``rank`` or record dicts if ``rank`` is None)."""
    added = []
    with _lock:
        add = _table.add
        want = bool(_subscribers)
        for row in rows:
            try:
                if rank is None:
                    values = {k: v for k, v in row.items() if k not in META}
                    r, nm, step, t = row["rank"], row["name"], row["step"], row["time"]
                else:
                    r, nm = rank, name
                    step, t, values = row
                    if not _PLAIN.issuperset(map(type, values.values())):
                        values = _unwrap(values)
                add(r, nm, step, t, values)
            except Exception:  # noqa: BLE001 - one malformed row must not cost the batch
                continue
            if want:
                added.append(_record(r, nm, step, t, values) if rank is not None else row)
        subs = list(_subscribers)
    for fn in subs:
        try:
            fn(added)
        except Exception:  # noqa: BLE001 - a broken display must not break logging
            pass


def _handler(kind: str) -> Callable[[dict], None] | None:
    """The handler registered for ``kind`` (tracing and timing register theirs when imported;
    rank 0's receiver imports both)."""
    return _internal.get(kind)


def register_internal(kind: str, handler: Callable[[dict], None] | None,
                      source: Callable[[], list[dict]] | None = None) -> None:
    """Route internal records ``{"__nbdist__": kind, ...}`` arriving at rank 0 to ``handler``.

    ``source`` (worker side) is called at every flush and returns internal records to send
    after the batch's ordinary records.
    """
    if handler is not None:
        _internal[kind] = handler
    if source is not None and source not in _extra_sources:
        _extra_sources.append(source)


def send_internal(kind: str, **fields: Any) -> None:
    """Hand ``{"__nbdist__": kind, **fields}`` to rank 0's handler for ``kind`` (from any rank)."""
    rec = {INTERNAL: kind, **fields}
    if _worker:
        _pending_internal.append(rec)
    else:
        deliver([rec])


def identity() -> tuple[int, str]:
    """``(rank, name)`` of this process, as the records it logs carry them."""
    return _rank, _name


def is_worker() -> bool:
    """Whether this process is a worker rank (its records go to the notebook)."""
    return _worker


def set_identity(rank: int, name: str) -> None:
    """This process is ``rank`` called ``name`` (rank 0: called when its world is ready)."""
    global _rank, _name
    _rank, _name = rank, name


def start_worker_flusher(channel: Any, rank: int, name: str) -> None:
    """Worker: this process is ``rank``; from now on ``log`` queues records and a thread sends
    them through ``channel`` every 50 ms."""
    global _worker
    _worker = True
    set_identity(rank, name)
    threading.Thread(target=_flush_loop, args=(channel, rank), daemon=True,
                     name="nbdist-metrics").start()


def _flush_loop(channel: Any, rank: int) -> None:
    """Every 50 ms: send what was logged. Where ``channel`` can ``drain``, wait (up to 5 s)
    until it is written, so records pile up here, bounded, not in the channel's queue."""
    drain = getattr(channel, "drain", None)
    while True:
        time.sleep(_FLUSH_EVERY)
        try:
            flush_worker(channel, rank)
            if drain is not None:
                drain(5.0)
        except BaseException:  # noqa: BLE001 - the flusher must outlive anything it meets
            time.sleep(_FLUSH_EVERY)


def _take(queue: collections.deque, n: int) -> list:
    pop = queue.popleft
    return [pop() for _ in range(n)]


def _specials() -> list[dict]:
    specials = _take(_pending_internal, len(_pending_internal))
    for source in _extra_sources:
        try:
            specials.extend(source())
        except Exception:  # noqa: BLE001
            pass
    return specials


def flush_worker(channel: Any, rank: int) -> None:
    """Send every record logged so far (and internal ones) in order, in one or more batches."""
    global _sent
    with _send_lock:
        left = len(_pending)
        while True:
            n = min(left, BATCH_ROWS)
            rows = _take(_pending, n)
            left -= n
            _sent += n
            specials = _specials() if left == 0 else []
            if rows or specials:
                _send_batch(channel, rank, (rank, _name, rows, specials))
            if left == 0:
                return


def _send_batch(channel: Any, rank: int, batch: tuple) -> None:
    """One metrics message; a batch that cannot be encoded is sent again value by value."""
    try:
        _send(channel, rank, batch)
    except OSError:
        pass  # the notebook is gone: nobody to tell
    except Exception:  # noqa: BLE001 - a value that cannot cross: send its repr instead
        r, name, rows, specials = batch
        rows = [(s, t, {k: v if type(v) in _PLAIN or type(v) is Opaque else Opaque.wrap(v)
                        for k, v in values.items()}) for s, t, values in rows]
        try:
            _send(channel, rank, (r, name, rows, specials))
        except Exception:  # noqa: BLE001 - still not: drop this batch, keep the flusher
            pass


def _send(channel: Any, rank: int, batch: tuple) -> None:
    # ``channel`` is the worker's metrics outbox (proc.worker): it wraps the batch in the
    # protocol's Metrics message; telemetry sits below proc and does not import it
    channel.send(batch)


def generation() -> int:
    """A number that changes each time ``clear_history`` runs."""
    return _generation


def record_count() -> int:
    """How many records the history holds."""
    return len(_table)


def history(rank: int | None = None, key: str | None = None) -> list[dict]:
    """Copies of the records received so far, optionally for one rank or one value name."""
    with _lock:
        return _table.rows(_table.select(rank, key))


def history_frame(rank: int | None = None, key: str | None = None) -> Any:
    """The history as a pandas DataFrame (needs pandas); same filters as ``history``."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("history_frame() needs pandas: pip install pandas") from exc
    return pd.DataFrame(history(rank, key))


def clear_history() -> None:
    """Forget every record received; rank 0's default step counter restarts at 0.

    A worker's own counter restarts with each new world (give ``step=`` to control it).
    """
    global _next_step, _generation, _table
    with _lock:
        _table = Table()
        _generation += 1
    _next_step = 0


def export_history(path: str) -> str:
    """Write the history to ``path``: ``.json`` (a list of records) or ``.csv``."""
    if not path.endswith((".json", ".csv")):
        raise ValueError(f"export_history: {path!r} should end in .csv or .json")
    rows = history()
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump(rows, f, default=repr)
        return path
    with _lock:
        cols = [*META, *_table.columns]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def subscribe(fn: Callable[[list[dict]], None]) -> None:
    """Call ``fn(records)`` (from the receiving thread, keep it quick) as records arrive."""
    with _lock:
        _subscribers.append(fn)


def follow(fn: Callable[[list[dict]], None]) -> tuple[list[dict], int]:
    """Subscribe ``fn`` and return ``(history so far, generation)`` in one atomic step.

    Every record is then either in the returned history or passed to ``fn`` later, never
    both, never neither. Calling it again for the same ``fn`` starts over.
    """
    return follow_with(fn, lambda table: table.rows(table.select(None, None)))


def follow_with(fn: Callable[[list[dict]], None],
                load: Callable[[Table], Any]) -> tuple[Any, int]:
    """Like ``follow``, but return ``load(the history's Table)`` instead of record dicts
    (``load`` runs under the history's lock: read the table there, keep no reference)."""
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)
        _subscribers.append(fn)
        return load(_table), _generation


def unsubscribe(fn: Callable[[list[dict]], None]) -> None:
    """Stop calling ``fn``."""
    with _lock:
        if fn in _subscribers:
            _subscribers.remove(fn)
