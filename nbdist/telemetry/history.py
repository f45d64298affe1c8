"""Rank 0's history of logged records: the table, delivery, subscribers, internal handlers.

The history is stored by column (``Table``): per record a rank, a name index, a step and a time
in ``array`` columns; per value name the indices of the records that carry it and their values
(an ``array('d')``/``array('q')`` while they are all floats or all ints, a list otherwise;
its size: ``bench/results/notes.md``). ``deliver`` takes a worker's batch (or rank 0's own
records), hands internal records to the handler of their kind and never stores them, and
calls the subscribers with each delivered batch as record dicts. All of it is one state
object, ``_History``, guarded by its lock.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..table import write_csv
from .values import INTERNAL, META, PLAIN, record, unwrap

__all__ = ["Table", "clear", "deliver", "export_history", "follow", "follow_with",
           "generation", "history", "history_frame", "record_count", "register_handler",
           "subscribe", "unsubscribe"]


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


class _History:
    """Everything rank 0 keeps of the records: one per process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.table = Table()
        self.generation = 0  # bumped by clear, so displays know to start over
        self.subscribers: list[Callable[[list[dict]], None]] = []
        self.handlers: dict[str, Callable[[dict], None]] = {}  # internal kind -> handler


_HISTORY_PER_PROCESS = _History()


def deliver(records: Any) -> None:
    """Add records to the history and tell the subscribers (internal records aside).

    ``records`` is a list of record dicts (internal ones, if any, at its end), or a worker's
    batch as ``outbox.flush_worker`` packs it: ``(rank, name, [(step, time, values), ...],
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
        handler = _HISTORY_PER_PROCESS.handlers.get(special[INTERNAL])
        if handler is not None:
            try:
                handler(special)
            except Exception:  # noqa: BLE001 - a broken handler must not break logging
                pass


def _store(rank: int | None, name: str | None, rows: list) -> None:
    """Append ``rows`` (worker rows of ``rank`` or record dicts if ``rank`` is None)."""
    added = []
    h = _HISTORY_PER_PROCESS
    with h.lock:
        add = h.table.add
        want = bool(h.subscribers)
        for row in rows:
            try:
                if rank is None:
                    values = {k: v for k, v in row.items() if k not in META}
                    r, nm, step, t = row["rank"], row["name"], row["step"], row["time"]
                else:
                    r, nm = rank, name
                    step, t, values = row
                    if not PLAIN.issuperset(map(type, values.values())):
                        values = unwrap(values)
                add(r, nm, step, t, values)
            except Exception:  # noqa: BLE001 - one malformed row must not cost the batch
                continue
            if want:
                added.append(record(r, nm, step, t, values) if rank is not None else row)
        subs = list(h.subscribers)
    for fn in subs:
        try:
            fn(added)
        except Exception:  # noqa: BLE001 - a broken display must not break logging
            pass


def register_handler(kind: str, handler: Callable[[dict], None]) -> None:
    """Internal records ``{"__nbdist__": kind, ...}`` go to ``handler``, not the history."""
    _HISTORY_PER_PROCESS.handlers[kind] = handler


def generation() -> int:
    """A number that changes each time ``clear`` runs."""
    return _HISTORY_PER_PROCESS.generation


def record_count() -> int:
    """How many records the history holds."""
    return len(_HISTORY_PER_PROCESS.table)


def history(rank: int | None = None, key: str | None = None) -> list[dict]:
    """Copies of the records received so far, optionally for one rank or one value name."""
    with _HISTORY_PER_PROCESS.lock:
        return _HISTORY_PER_PROCESS.table.rows(_HISTORY_PER_PROCESS.table.select(rank, key))


def history_frame(rank: int | None = None, key: str | None = None) -> Any:
    """The history as a pandas DataFrame (needs pandas); same filters as ``history``."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("history_frame() needs pandas: pip install pandas") from exc
    return pd.DataFrame(history(rank, key))


def clear() -> None:
    """Forget every record received."""
    with _HISTORY_PER_PROCESS.lock:
        _HISTORY_PER_PROCESS.table = Table()
        _HISTORY_PER_PROCESS.generation += 1


def export_history(path: str) -> str:
    """Write the history to ``path``: ``.json`` (a list of records) or ``.csv``."""
    if not path.endswith((".json", ".csv")):
        raise ValueError(f"export_history: {path!r} should end in .csv or .json")
    rows = history()
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump(rows, f, default=repr)
        return path
    with _HISTORY_PER_PROCESS.lock:
        cols = [*META, *_HISTORY_PER_PROCESS.table.columns]
    return write_csv(path, cols, rows)


def subscribe(fn: Callable[[list[dict]], None]) -> None:
    """Call ``fn(records)`` (from the receiving thread, keep it quick) as records arrive."""
    with _HISTORY_PER_PROCESS.lock:
        _HISTORY_PER_PROCESS.subscribers.append(fn)


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
    with _HISTORY_PER_PROCESS.lock:
        if fn in _HISTORY_PER_PROCESS.subscribers:
            _HISTORY_PER_PROCESS.subscribers.remove(fn)
        _HISTORY_PER_PROCESS.subscribers.append(fn)
        return load(_HISTORY_PER_PROCESS.table), _HISTORY_PER_PROCESS.generation


def unsubscribe(fn: Callable[[list[dict]], None]) -> None:
    """Stop calling ``fn``."""
    with _HISTORY_PER_PROCESS.lock:
        if fn in _HISTORY_PER_PROCESS.subscribers:
            _HISTORY_PER_PROCESS.subscribers.remove(fn)
