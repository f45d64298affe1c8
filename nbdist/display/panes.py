"""The pure parts of ``%%dist --tabs``: a rank's text as it arrives, tab titles, pane HTML.

Data shapes:

- ``RankText`` holds one rank's output as lines ``(stream, text)``, ``stream`` being
  "stdout" or "stderr". ``feed(stream, chunk)`` takes any chunking: ``\\n`` ends a line, a
  ``\\r`` rewrites the unfinished one (a progress bar stays one line). Only the last ``keep``
  complete lines are kept; ``hidden`` counts the ones let go. A tab of several ranks feeds
  each one's chunks with its name (``feed(stream, chunk, label)``): lines read ``[name] ...``,
  each rank's unfinished line its own.
- A rank's state is one of ``STATES``: "running", "done", "failed", "dead".
- ``tab_title(name, state)`` is the tab's title: the rank's name and a badge.
- Past ``MAX_TABS`` ranks, ``tab_groups`` puts ranks in tabs (a tab per host, or runs of
  consecutive ranks), ``group_title(names, states)`` titles one: ``worker1-16: ✔ 15 done,
  ✘ 1 failed``.
- ``render_pane(lines, hidden)`` is the HTML of one tab's body.
"""

from __future__ import annotations

import collections
import html
import math

from ..rank_sets import grouped, rank_set

__all__ = ["BADGES", "MAX_TABS", "STATES", "TAB_LINES", "RankText", "group_title",
           "render_pane", "tab_groups", "tab_title"]

TAB_LINES = 2000  # lines kept and shown per tab
MAX_TABS = 16  # past this many ranks, ranks share tabs
STATES = ("running", "done", "failed", "dead")
BADGES = {"running": "⏳", "done": "✔", "failed": "✘", "dead": "☠"}


def _settled(line: str) -> str:
    """What a line rewritten with ``\\r`` shows in the end."""
    return line.rstrip("\r").rsplit("\r", 1)[-1] if "\r" in line else line


class RankText:
    """One rank's output, bounded to its last ``keep`` lines."""

    def __init__(self, keep: int = TAB_LINES) -> None:
        self.lines: collections.deque[tuple[str, str]] = collections.deque(maxlen=keep)
        self.partial: dict[tuple[str, str], str] = {}  # (stream, label) -> unfinished line
        self.hidden = 0

    def feed(self, stream: str, text: str, label: str = "") -> None:
        """``text`` printed on ``stream`` (by the rank named ``label``, in a shared tab)."""
        *done, tail = (self.partial.pop((stream, label), "") + text).split("\n")
        head = f"[{label}] " if label else ""
        for line in done:
            if len(self.lines) == self.lines.maxlen:
                self.hidden += 1
            self.lines.append((stream, head + _settled(line)))
        if tail:
            self.partial[(stream, label)] = tail[-(1 << 16):]

    def view(self) -> list[tuple[str, str]]:
        """The lines to show: the complete ones, then each stream's unfinished line."""
        return [*self.lines, *((s, (f"[{label}] " if label else "") + _settled(t))
                               for (s, label), t in self.partial.items())]


def tab_title(name: str, state: str) -> str:
    """``worker1 ✔ done``: the rank's name, then its badge."""
    return f"{name} {_badge(state)} {state}"


def _badge(state: str) -> str:
    if state not in BADGES:
        raise ValueError(f"a rank's state is one of {STATES}, got {state!r}")
    return BADGES[state]


def tab_groups(ranks: list[int], hosts: dict[int, str] | None = None,
               most: int = MAX_TABS) -> list[list[int]]:
    """The ranks of each tab: a tab per rank up to ``most`` ranks; past it a tab per host
    when the ranks span 2 to ``most`` hosts (``hosts``: rank -> host), else at most
    ``most`` tabs of consecutive ranks."""
    ranks = sorted(ranks)
    if len(ranks) <= most:
        return [[r] for r in ranks]
    by_host = grouped(ranks, lambda r: (hosts or {}).get(r) or "")
    if 1 < len(by_host) <= most:
        return [members for _, members in by_host]
    size = math.ceil(len(ranks) / most)
    return [ranks[i:i + size] for i in range(0, len(ranks), size)]


def group_title(names: list[str], states: list[str]) -> str:
    """A tab's title: ``tab_title`` for one rank; for several their names written compactly
    and how many are in each state, ``worker1-16: ✔ 15 done, ✘ 1 failed``."""
    if len(names) == 1:
        return tab_title(names[0], states[0])
    counts = collections.Counter(states)
    for state in counts:
        _badge(state)
    return f"{rank_set(names)}: " + ", ".join(f"{BADGES[s]} {counts[s]} {s}" for s in STATES
                                              if counts[s])


def render_pane(lines: list[tuple[str, str]], hidden: int = 0) -> str:
    """HTML of one tab: its lines in a scrolling ``<pre>`` (stderr in red), after a note of
    the ``hidden`` earlier lines (``%dist_logs`` has them)."""
    body = "\n".join(f'<span style="color:#c00">{html.escape(t)}</span>' if s == "stderr"
                     else html.escape(t) for s, t in lines)
    note = (f'<div style="opacity:0.7">({hidden:,} earlier lines: <code>%dist_logs</code>)'
            "</div>" if hidden else "")
    if not lines:
        body = '<span style="opacity:0.6">(no output yet)</span>'
    return (f'{note}<pre style="margin:0;max-height:24em;overflow:auto;'
            f'white-space:pre-wrap">{body}</pre>')
