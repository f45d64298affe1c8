"""Workers' rich outputs in the notebook: mime bundles led by a ``[name]`` label, per rank.

The receiver hands every ``DisplayData`` and ``ClearOutput`` to ``RichOutput.show`` (``piece``
joins a big display's ``DisplayChunk`` pieces first). In a Jupyter kernel each bundle is
published as it is, after a label naming the rank, under a display id of its own, so a rank's
``clear_output`` and ``handle.update(...)`` reach only that rank's outputs; outside Jupyter it
is written as ``[name] <text/plain>``. ``%%dist --grid`` shows a cell's bundles as one table
(``render_grid``, pure). Ordering and reuse of places: docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import html
import itertools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..control.protocol import ClearOutput, DisplayChunk, DisplayData, ProtocolError, decode
from ..rank_info import RankInfo
from .router import Router, in_jupyter

__all__ = ["RichOutput", "render_grid"]

_BLANK = {"text/plain": ""}
MAX_IDS = 10_000  # worker display ids remembered per rank (for updates)
CELL_DISPLAYS = int(os.environ.get("NBDIST_CELL_DISPLAYS", "500"))  # new outputs/rank/cell
_IMAGES = ("image/png", "image/jpeg", "image/gif")
PENDING = 8  # displays per rank whose pieces are still arriving (older ones are dropped)
MAX_PIECES = 4096  # pieces of one display (256 KB each: 1 GB, far past the display limit)
REGROUP_BYTES = 256 * 2**20  # bundles kept during a cell to regroup it (past this: not)


def _cell_key() -> Any:
    """Which notebook cell runs now (its execution count), so a clear stays in its cell."""
    from IPython import get_ipython

    ip = get_ipython()
    return getattr(ip, "execution_count", None)


class _Slot:
    """One place in the notebook showing a rank's output: a label and the bundle.

    ``shows`` is the bundle there now, ``(data, metadata)``, kept only while the cell that
    made the place runs (``tracked``: to move it at the end); ``fresh``: its display id is
    its own."""

    __slots__ = ("label", "data", "blank", "rank", "name", "shows", "fresh", "tracked")

    def __init__(self, label: str, data: str, rank: int = 0, name: str = "",
                 fresh: bool = False) -> None:
        self.label, self.data, self.blank = label, data, False
        self.rank, self.name, self.fresh = rank, name, fresh
        self.shows: tuple[dict, dict] | None = None
        self.tracked = False


class _RankView:
    """What one rank has shown in the running cell."""

    def __init__(self) -> None:
        self.cell: Any = None
        self.shown: list[_Slot] = []
        self.free: list[_Slot] = []  # blanked by a clear; the next displays reuse them
        self.clear_wait = False
        self.ids: dict[str, str] = {}  # the worker's display id -> the notebook's
        self.count = 0  # new outputs in this cell (reused places not counted)


class RichOutput:
    """Shows every rank's rich outputs; one per world; thread-safe."""

    def __init__(self, ranks: dict[int, RankInfo]) -> None:
        self.ranks = ranks
        self.jupyter = in_jupyter()
        self._lock = threading.RLock()
        self._views: dict[int, _RankView] = {}
        self._ids = itertools.count(1)
        self._prefix = f"nbdist-{os.getpid()}-{id(self):x}"
        self._grid: dict[int, list[tuple[dict, str | None]]] | None = None
        self._grid_clear: set[int] = set()
        self._hide_results: set[int] = set()
        self._results: set[tuple[int, int]] = set()  # (exec id, rank) shown as a bundle
        self._order: list[_Slot] | None = None  # places the running cell made, in order
        self._held = 0  # bytes of bundles kept in those places' ``shows``
        self._pieces: dict[tuple[int, int], list[bytes]] = {}  # (rank, bundle) -> pieces
        self.assembled = 0  # displays that arrived in pieces (for tests and status)

    # -- a %%dist cell ------------------------------------------------------------------------
    @contextmanager
    def cell(self, targets: list[int], grid: bool = False, results: bool = True) -> Iterator[None]:
        """Around one cell on ``targets``: ``grid`` gathers their bundles into one table shown
        at the end; ``results=False`` drops rich last values (``run(show=False)``)."""
        with self._lock:
            if grid:
                self._grid = {r: [] for r in targets}
                self._grid_clear = set()
            elif self.jupyter:
                self._order, self._held = [], 0
            if not results:
                self._hide_results = set(targets)
        try:
            yield
        finally:
            with self._lock:
                columns, self._grid = self._grid, None
                order, self._order = self._order, None
                self._hide_results = set()
                if order:
                    try:
                        self._regroup(order)
                    finally:
                        for slot in order:
                            slot.shows, slot.tracked = None, False
            if columns is not None and any(columns.values()):
                self._show_grid(columns)

    def took_result(self, exec_id: int, rank: int) -> bool:
        """Whether ``rank``'s last value of cell ``exec_id`` was shown as a rich bundle
        (then its text line is not printed again); asking forgets it."""
        with self._lock:
            key = (exec_id, rank)
            if key in self._results:
                self._results.discard(key)
                return True
            return False

    # -- from the receiver --------------------------------------------------------------------
    def piece(self, rank: int, msg: DisplayChunk) -> DisplayData | None:
        """Keep one piece of a big display; the whole ``DisplayData`` once the last piece is
        in (then ``show`` it), else None. Pieces out of step drop that display."""
        with self._lock:
            key = (rank, msg.bundle)
            if msg.index == 0:
                self._pieces[key] = []
                mine = [k for k in self._pieces if k[0] == rank]
                if len(mine) > PENDING:  # a display whose sender was interrupted
                    del self._pieces[mine[0]]
            parts = self._pieces.get(key)
            if parts is None or msg.index != len(parts) or not 0 < msg.total <= MAX_PIECES:
                self._pieces.pop(key, None)
                raise ProtocolError(f"piece {msg.index} of {msg.total} of a display out of "
                                    "step; that display was dropped")
            parts.append(msg.piece)
            if len(parts) < msg.total:
                return None
            del self._pieces[key]
        whole = decode(b"".join(parts))
        if not isinstance(whole, DisplayData):
            raise ProtocolError(f"pieces of a display that make a {whole.TAG!r} message")
        self.assembled += 1
        return whole

    def show(self, rank: int, name: str, msg: DisplayData | ClearOutput) -> None:
        """One rich output or clear from ``rank``, in the running cell."""
        with self._lock:
            if isinstance(msg, DisplayData) and msg.result_of:
                if rank in self._hide_results or not self.jupyter:
                    return  # outside Jupyter the value's text line says it all
                self._results.add((msg.result_of, rank))
            if self._grid is not None and rank in self._grid:
                self._to_grid(rank, msg)
                return
            if isinstance(msg, ClearOutput):
                self._clear(rank, msg.wait)
                return
            if not self.jupyter:
                self._write_text(name, msg)
                return
            if msg.update:
                self._update(rank, name, msg)
            else:
                self._display(rank, name, msg)

    def _view(self, rank: int) -> _RankView:
        view = self._views.setdefault(rank, _RankView())
        cell = _cell_key()
        if view.cell != cell:  # a new notebook cell: earlier outputs are not this cell's
            view.cell, view.shown, view.free, view.clear_wait = cell, [], [], False
            view.count = 0
        return view

    def _meta(self, rank: int, name: str, metadata: dict) -> dict:
        return {**metadata, "nbdist": {"rank": rank, "name": name}}

    def _label(self, rank: int, name: str) -> tuple[dict, dict]:
        data = {"text/plain": f"[{name}]",
                "text/html": f'<div style="font-size:smaller;opacity:0.7">'
                             f'[{html.escape(name)}]</div>'}
        return data, {"nbdist": {"rank": rank, "name": name, "label": True}}

    def _display(self, rank: int, name: str, msg: DisplayData) -> None:
        from IPython.display import publish_display_data

        view = self._view(rank)
        if view.clear_wait:  # clear_output(wait=True): this output takes the first place
            view.free = view.shown + view.free
            view.shown, view.clear_wait = [], False
        nb_id = view.ids.get(msg.display_id) if msg.display_id else None
        meta = self._meta(rank, name, msg.metadata)
        if view.free:
            slot = view.free.pop(0)
            if msg.display_id:
                view.ids[msg.display_id] = slot.data  # updates go to the reused place
            if slot.blank:
                label, label_md = self._label(rank, name)
                publish_display_data(label, label_md, transient={"display_id": slot.label},
                                     update=True)
            publish_display_data(msg.data, meta, transient={"display_id": slot.data},
                                 update=True)
            slot.blank = False
            self._keep(slot, msg.data, meta)
            for other in view.free:  # the rest of what the clear covered goes blank now
                self._blank(other)
        else:
            view.count += 1
            if view.count > CELL_DISPLAYS:  # a flood of displays would freeze the browser
                if view.count == CELL_DISPLAYS + 1:
                    Router.write("stderr", f"[{name}] nbdist: more than {CELL_DISPLAYS} "
                                           "displays from this rank in one cell; the rest are "
                                           "not shown (clear_output(wait=True) reuses one "
                                           "place; NBDIST_CELL_DISPLAYS sets the limit)\n")
                return
            label_id = f"{self._prefix}-{next(self._ids)}"
            fresh = nb_id is None
            if nb_id is None:
                nb_id = f"{self._prefix}-{next(self._ids)}"
                if msg.display_id:
                    view.ids[msg.display_id] = nb_id
                    if len(view.ids) > MAX_IDS:  # the oldest can no longer be updated
                        del view.ids[next(iter(view.ids))]
            label, label_md = self._label(rank, name)
            publish_display_data(label, label_md, transient={"display_id": label_id})
            publish_display_data(msg.data, meta, transient={"display_id": nb_id})
            slot = _Slot(label_id, nb_id, rank, name, fresh)
            if self._order is not None:
                self._order.append(slot)
                slot.tracked = True
                self._keep(slot, msg.data, meta)
        view.shown.append(slot)

    def _update(self, rank: int, name: str, msg: DisplayData) -> None:
        from IPython.display import publish_display_data

        view = self._views.setdefault(rank, _RankView())
        nb_id = view.ids.get(msg.display_id or "")
        if nb_id is not None:
            meta = self._meta(rank, name, msg.metadata)
            publish_display_data(msg.data, meta, transient={"display_id": nb_id}, update=True)
            if self._order is not None:
                for slot in view.shown:
                    if slot.data == nb_id:
                        self._keep(slot, msg.data, meta)

    def _clear(self, rank: int, wait: bool) -> None:
        if not self.jupyter:
            return
        view = self._view(rank)
        if wait:
            view.clear_wait = True
            return
        for slot in view.shown:
            self._blank(slot)
        view.free, view.shown, view.clear_wait = view.shown + view.free, [], False

    def _keep(self, slot: _Slot, data: dict, meta: dict) -> None:
        """Remember what ``slot`` shows now, if the running cell may move it at its end."""
        if self._order is None or not slot.tracked:
            return
        if slot.shows is not None:
            self._held -= _size(slot.shows[0])
        self._held += _size(data)
        if self._held > REGROUP_BYTES:  # too much to keep: this cell stays as it arrived
            for s in self._order:
                s.shows, s.tracked = None, False
            self._order = None
            return
        slot.shows = (data, meta)

    def _regroup(self, order: list[_Slot]) -> None:
        """At the end of a cell: if ranks' outputs interleaved, refill the places they took
        in rank order (each rank's in its own order); nothing when they did not."""
        seen: set[int] = set()
        last = None
        for slot in order:
            if slot.rank != last:
                if slot.rank in seen:
                    break
                seen.add(slot.rank)
                last = slot.rank
        else:
            return  # each rank's outputs are together already
        if not all(s.fresh and (s.blank or s.shows is not None) for s in order) or \
                len({s.data for s in order}) != len(order):
            return  # a place shares its display id (with another cell): moving it is unsafe
        from IPython.display import publish_display_data

        places = [(s.label, s.data) for s in order]
        target = sorted(order, key=lambda s: s.rank)  # stable: each rank keeps its order
        moved: dict[str, str] = {}
        for (label_id, data_id), slot, was in zip(places, target, order, strict=True):
            if slot is was:
                continue
            moved[slot.data] = data_id
            if slot.blank:
                data, meta, label, label_md = _BLANK, {}, _BLANK, {}
            else:
                assert slot.shows is not None
                data, meta = slot.shows
                label, label_md = self._label(slot.rank, slot.name)
            if slot.blank or was.blank or slot.rank != was.rank:
                publish_display_data(label, label_md, transient={"display_id": label_id},
                                     update=True)
            publish_display_data(data, meta, transient={"display_id": data_id}, update=True)
        for (label_id, data_id), slot in zip(places, target, strict=True):
            slot.label, slot.data = label_id, data_id
        for view in self._views.values():  # a worker's handle updates its output's new place
            for worker_id, nb_id in view.ids.items():
                if nb_id in moved:
                    view.ids[worker_id] = moved[nb_id]

    def _blank(self, slot: _Slot) -> None:
        from IPython.display import publish_display_data

        if not slot.blank:
            publish_display_data(_BLANK, {}, transient={"display_id": slot.label}, update=True)
            publish_display_data(_BLANK, {}, transient={"display_id": slot.data}, update=True)
            slot.blank = True

    def _write_text(self, name: str, msg: DisplayData) -> None:
        if msg.update:
            return
        text = str(msg.data.get("text/plain", f"<a display of {', '.join(msg.data)}>"))
        Router.write("stdout", "".join(f"[{name}] {line}\n" for line in text.split("\n")))

    # -- --grid -------------------------------------------------------------------------------
    def _to_grid(self, rank: int, msg: DisplayData | ClearOutput) -> None:
        assert self._grid is not None
        items = self._grid[rank]
        if isinstance(msg, ClearOutput):
            if msg.wait:
                self._grid_clear.add(rank)
            else:
                items.clear()
            return
        if rank in self._grid_clear:
            self._grid_clear.discard(rank)
            items.clear()
        if msg.update:
            for i, (_, did) in enumerate(items):
                if did == msg.display_id:
                    items[i] = (msg.data, did)
            return
        if len(items) < CELL_DISPLAYS:
            items.append((msg.data, msg.display_id))

    def _show_grid(self, columns: dict[int, list[tuple[dict, str | None]]]) -> None:
        named = [(self.ranks[r].name if r in self.ranks else f"rank {r}",
                  [data for data, _ in items]) for r, items in columns.items()]
        if not self.jupyter:
            for name, bundles in named:
                for data in bundles:
                    self._write_text(name, DisplayData(0, data, {}))
            return
        from IPython.display import publish_display_data

        text = "\n".join(f"[{name}] {len(b)} output{'s' if len(b) != 1 else ''}"
                         for name, b in named)
        publish_display_data({"text/html": render_grid(named), "text/plain": text},
                             {"nbdist": {"grid": True, "ranks": list(columns),
                                         "names": [n for n, _ in named]}})


def _size(data: dict) -> int:
    return sum(len(v) for v in data.values() if isinstance(v, str))


def render_grid(columns: list[tuple[str, list[dict]]]) -> str:
    """An HTML table, one column per ``(name, bundles)``, each bundle in its richest form
    HTML can hold: HTML, images (inline data URLs), SVG, or escaped text."""
    head = "".join(f'<th style="text-align:center">[{html.escape(name)}]</th>'
                   for name, _ in columns)
    cells = "".join('<td style="vertical-align:top;text-align:left">'
                    + "".join(_bundle_html(b) for b in bundles) + "</td>"
                    for _, bundles in columns)
    return (f'<table class="nbdist-grid"><thead><tr>{head}</tr></thead>'
            f"<tbody><tr>{cells}</tr></tbody></table>")


def _bundle_html(data: dict) -> str:
    if "text/html" in data:
        return f"<div>{data['text/html']}</div>"
    for mime in _IMAGES:
        if mime in data:
            return (f'<div><img src="data:{mime};base64,{data[mime]}" '
                    'style="max-width:100%"/></div>')
    if "image/svg+xml" in data:
        return f"<div>{data['image/svg+xml']}</div>"
    text = data.get("text/markdown") or data.get("text/plain", "")
    return f"<pre>{html.escape(str(text))}</pre>"
