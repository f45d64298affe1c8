"""``%%dist --tabs``: one live tab per rank, its title a status badge, its body the output;
past ``MAX_TABS`` ranks a tab per host or per run of ranks, its lines led by their rank's name.

``rank_tabs(cluster, ranks)`` is a context manager around a cell: an ipywidgets ``Tab`` with one
``HTML`` pane per rank receives the rank's output (``Router.viewing``) instead of the flat
stream; a thread updates changed panes and titles (running → done, failed or dead) at most
every ``EVERY`` seconds, in place. Rich outputs still show below, labelled with their rank.
Without a widget frontend the cell shows the flat stream, after one line that says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..output.router import Router, in_jupyter
from .panes import MAX_TABS, RankText, group_title, render_pane, tab_groups

__all__ = ["EVERY", "RankTabs", "rank_tabs"]

EVERY = 0.2  # seconds between two redraws
JOIN_SECONDS = 2.0  # how long closing waits for a redraw in progress
FALLBACK = ("nbdist: --tabs needs a Jupyter frontend with ipywidgets; this cell's output "
            "shows as one stream\n")


class RankTabs:
    """A tab per rank (past ``most`` ranks a tab per group of ranks: ``panes.tab_groups``),
    redrawn from a thread of its own (``start``/``close``)."""

    def __init__(self, names: dict[int, str], alive: Callable[[int], bool],
                 hosts: dict[int, str] | None = None, most: int = MAX_TABS) -> None:
        """``names``: rank -> name of the ranks shown; ``alive(rank)``: whether its process
        still runs (a rank whose process ends before its cell does is shown dead);
        ``hosts``: rank -> host, for a tab per host in a big world across hosts."""
        import ipywidgets

        self.names, self._alive = dict(names), alive
        self.groups = tab_groups(list(names), hosts, most)
        self.tab_of = {r: i for i, members in enumerate(self.groups) for r in members}
        self._shared = any(len(members) > 1 for members in self.groups)
        self.text = [RankText() for _ in self.groups]
        self.states = {r: "running" for r in names}
        self._lock = threading.Lock()
        self._dirty: set[int] = set()  # tabs whose text changed
        self._stop = threading.Event()
        self.panes = [ipywidgets.HTML(render_pane([])) for _ in self.groups]
        self.tab = ipywidgets.Tab(children=self.panes, titles=self._titles())
        self._thread = threading.Thread(target=self._loop, daemon=True, name="nbdist-tabs")

    def _titles(self) -> tuple[str, ...]:
        return tuple(group_title([self.names[r] for r in members],
                                 [self.states[r] for r in members])
                     for members in self.groups)

    # -- the router's RankView -----------------------------------------------------------------
    def takes(self, rank: int) -> bool:
        return rank in self.tab_of

    def output(self, rank: int, name: str, stream: str, text: str) -> None:
        tab = self.tab_of[rank]
        with self._lock:
            self.text[tab].feed(stream, text, name if self._shared else "")
            self._dirty.add(tab)

    def finished(self, rank: int, ok: bool) -> None:
        with self._lock:
            self.states[rank] = "done" if ok else "failed"

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        from IPython.display import display

        display(self.tab)
        self._thread.start()

    def close(self) -> None:
        """Stop redrawing, after a last redraw with every rank's final state."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(JOIN_SECONDS)
        self.redraw()

    def _loop(self) -> None:
        while not self._stop.wait(EVERY):
            try:
                self.redraw()
            except Exception as exc:  # noqa: BLE001 - a display must not end the cell
                Router.write("stderr", f"nbdist: redrawing the tabs failed: {exc!r}\n")
                return

    def redraw(self) -> None:
        """Set the panes whose text changed, and the titles if a state changed."""
        with self._lock:
            for r, state in self.states.items():
                if state == "running" and not self._alive(r):
                    self.states[r] = "dead"
            dirty, self._dirty = self._dirty, set()
            views = {i: (self.text[i].view(), self.text[i].hidden) for i in dirty}
            titles = self._titles()
        for i, (lines, hidden) in views.items():
            self.panes[i].value = render_pane(lines, hidden)
        if tuple(self.tab.titles) != titles:
            self.tab.titles = titles


def _widgets_available() -> bool:
    if not in_jupyter():
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def rank_tabs(cluster: Any, ranks: list[int]) -> Iterator[RankTabs | None]:
    """Around a cell on ``ranks`` of ``cluster``: their output in a live tab each (None, and
    the flat stream, where widgets cannot show)."""
    if not _widgets_available():
        Router.write("stderr", FALLBACK)
        yield None
        return
    workers = [r for r in ranks if r]  # rank 0 (``--local``) prints in the notebook itself
    view = RankTabs({r: cluster.names[r] for r in workers}, lambda r: cluster.ranks[r].alive,
                    {r: cluster.ranks[r].host for r in workers if cluster.ranks[r].host})
    view.start()
    try:
        with cluster.router.viewing(view):
            yield view
    finally:
        view.close()
