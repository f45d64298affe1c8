"""The pure parts of ``%%dist --tabs``: a rank's text as it arrives, tab titles, pane HTML.

Data shapes:

- ``RankText`` holds one rank's output as lines ``(stream, text)``, ``stream`` being
  "stdout" or "stderr". ``feed(stream, chunk)`` takes any chunking: ``\\n`` ends a line, a
  ``\\r`` rewrites the unfinished one (a progress bar stays one line). Only the last ``keep``
  complete lines are kept; ``hidden`` counts the ones let go.
- A rank's state is one of ``STATES``: "running", "done", "failed", "dead".
- ``tab_title(name, state)`` is the tab's title: the rank's name and a badge.
- ``render_pane(lines, hidden)`` is the HTML of one tab's body.
"""

from __future__ import annotations

import collections
import html

__all__ = ["BADGES", "STATES", "TAB_LINES", "RankText", "render_pane", "tab_title"]

TAB_LINES = 2000  # lines kept and shown per rank
STATES = ("running", "done", "failed", "dead")
BADGES = {"running": "⏳", "done": "✔", "failed": "✘", "dead": "☠"}


def _settled(line: str) -> str:
    """What a line rewritten with ``\\r`` shows in the end."""
    return line.rstrip("\r").rsplit("\r", 1)[-1] if "\r" in line else line


class RankText:
    """One rank's output, bounded to its last ``keep`` lines."""

    def __init__(self, keep: int = TAB_LINES) -> None:
        self.lines: collections.deque[tuple[str, str]] = collections.deque(maxlen=keep)
        self.partial: dict[str, str] = {}  # stream -> the unfinished line
        self.hidden = 0

    def feed(self, stream: str, text: str) -> None:
        *done, tail = (self.partial.pop(stream, "") + text).split("\n")
        for line in done:
            if len(self.lines) == self.lines.maxlen:
                self.hidden += 1
            self.lines.append((stream, _settled(line)))
        if tail:
            self.partial[stream] = tail[-(1 << 16):]

    def view(self) -> list[tuple[str, str]]:
        """The lines to show: the complete ones, then each stream's unfinished line."""
        return [*self.lines, *((s, _settled(t)) for s, t in self.partial.items())]


def tab_title(name: str, state: str) -> str:
    """``worker1 ✔ done``: the rank's name, then its badge."""
    if state not in BADGES:
        raise ValueError(f"a rank's state is one of {STATES}, got {state!r}")
    return f"{name} {BADGES[state]} {state}"


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
