"""Worker output in the notebook: rank-led lines, live progress lines, logs, flood limits.

``Router.feed`` gets each rank's text as it arrives. Complete lines go to the running cell as
``[name] line`` (``cell_stream``: in Jupyter the kernel's own stream, even while user code
redirects ``sys.stdout``). A line rewritten with ``\\r`` (tqdm) is one live line per rank, updated
in place at most every ``LIVE_EVERY`` seconds; other unfinished lines go out after
``PARTIAL_WAIT`` seconds of silence. Each rank's tail (``TAIL_LINES``) stays in memory and its full
log in the world's runtime directory (``logs``); a rank past ``limit_lines`` or ``limit_bytes`` in
one cell stops echoing and says once where the rest is (``%dist_logs``). With ``aggregate``, a line
several ranks print at once shows once, led by the rank set (``output.aggregate``), except from a
rank printing over ``FLOOD_RATE`` lines a second. Within ``viewing(view)``, the ranks
``view.takes`` go to ``view`` (``%%dist --tabs``) instead of the flat stream.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from ..rank_sets import rank_set
from .aggregate import Aggregator, Held
from .line_guard import watch, write_after

__all__ = ["LiveLine", "RankView", "Router", "StatusLine", "cell_stream", "in_jupyter"]

TAIL_LINES = 10_000
PARTIAL_LIMIT = 1 << 16  # characters of one unfinished line held per rank and stream
PARTIAL_WAIT = 0.2  # seconds of silence before an unfinished (non-\r) line is written
LIVE_EVERY = 0.1  # seconds between two updates of a rank's live line
CELL_LINES = int(os.environ.get("NBDIST_CELL_OUTPUT_LINES", "20000"))
CELL_BYTES = int(float(os.environ.get("NBDIST_CELL_OUTPUT_MB", "5")) * 2**20)
# how long a line waits for the same line from other ranks (aggregate on)
AGGREGATE_WINDOW = float(os.environ.get("NBDIST_AGGREGATE_MS", "100")) / 1000
FLOOD_RATE = 1000  # lines a second from one rank beyond which its lines are not merged


def in_jupyter() -> bool:
    """Whether this process is a Jupyter kernel (display handles reach a frontend; not a
    terminal IPython, not a plain script)."""
    if "ipykernel" not in sys.modules:  # cheap, and IPython is not imported for nothing
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def cell_stream(stream: str) -> Any:
    """Where nbdist writes ``stream`` ("stdout" or "stderr") for the running cell.

    In a Jupyter kernel: the kernel's own stream (ipykernel's ``OutStream``, which sends to
    the cell the kernel runs), never one put in its place for a while by the user's code
    (``contextlib.redirect_stdout``, pytest's capture run in a kernel): workers' lines must
    not end up in the user's buffer. Elsewhere (a terminal, a script, a test): the current
    ``sys.stdout`` or ``sys.stderr``.
    """
    current = sys.stderr if stream == "stderr" else sys.stdout
    if not in_jupyter():
        return current
    from ipykernel.iostream import OutStream
    from IPython import get_ipython

    if isinstance(current, OutStream):
        return current
    kernel = getattr(get_ipython(), "kernel", None)
    own = getattr(kernel, f"_{stream}", None)  # the OutStream the kernel was made with
    return own if isinstance(own, OutStream) else current


class LiveLine:
    """One rank's line updated in place through a Jupyter display handle."""

    def __init__(self) -> None:
        self.handle: Any = None

    def show(self, text: str) -> None:
        from IPython.display import display

        bundle = {"text/plain": text}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)


class _TerminalLive:
    """Outside Jupyter every rank's live line shares one terminal line, rewritten with ``\r``."""

    def __init__(self) -> None:
        self.lines: dict[tuple[int, str], str] = {}
        self.width = 0

    def _render(self, end: str = "") -> None:
        text = " | ".join(self.lines.values())
        pad = max(self.width - len(text), 0)
        Router.write("stderr", f"\r{text}{' ' * pad}{end}")
        self.width = len(text)

    def show(self, key: tuple[int, str], text: str) -> None:
        self.lines[key] = text
        self._render()

    def finish(self, key: tuple[int, str], text: str) -> None:
        """Print ``text`` as a line of its own; the other live lines go on below it."""
        self.lines.pop(key, None)
        pad = max(self.width - len(text), 0)
        Router.write("stderr", f"\r{text}{' ' * pad}\n")
        self.width = 0
        if self.lines:
            self._render()


class StatusLine:
    """A one-line status updated in place (Jupyter display handle, or ``\r`` on stderr)."""

    AFTER = 2.0  # a wait (cell, start) running longer than this gets a status line
    EVERY = 0.5  # seconds between its updates

    def __init__(self) -> None:
        self.jupyter = in_jupyter()
        self.live = LiveLine() if self.jupyter else None
        self.width = 0
        self.shown = False

    def show(self, text: str) -> None:
        self.shown = True
        if self.live is not None:
            self.live.show(text)
        else:
            Router.write("stderr", f"\r{text}{' ' * max(self.width - len(text), 0)}")
            self.width = len(text)

    def done(self, text: str, always: bool = False) -> None:
        """End with ``text`` as the line's final state (only if it was ever shown, unless
        ``always``)."""
        if not (self.shown or always):
            return
        if self.live is not None:
            self.live.show(text)
        else:
            Router.write("stderr", f"\r{text}{' ' * max(self.width - len(text), 0)}\n")


class RankView(Protocol):
    """A view of each rank's output in the running cell (``Router.viewing``); its methods are
    called from the receiving thread and must not block."""

    def takes(self, rank: int) -> bool:
        """Whether this rank's output goes to the view (not to the flat stream)."""

    def output(self, rank: int, name: str, stream: str, text: str) -> None:
        """Text the rank wrote, in any chunking."""

    def finished(self, rank: int, ok: bool) -> None:
        """The rank's cell ended: ``ok``, or with an error."""


class _RankOut:
    """What the router keeps for one rank."""

    def __init__(self, rank: int, name: str, log_dir: str | None) -> None:
        self.rank, self.name = rank, name
        self.partial: dict[str, str] = {}
        self.partial_at: dict[str, float] = {}
        self.live: dict[str, LiveLine | None] = {}  # None: on the shared terminal line
        self.live_at: dict[str, float] = {}
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.lines = 0  # echoed in this cell
        self.chars = 0
        self.rate_since, self.rate_lines = 0.0, 0  # lines shown in the current second
        self.muted = False  # over this cell's limit
        self.log = None
        self.log_path: str | None = None
        if log_dir is not None:
            self.log_path = os.path.join(log_dir, f"rank{rank}-{name}.log")
            self.log = open(self.log_path, "a", encoding="utf-8", newline="")  # noqa: SIM115


class Router:
    """Routes every rank's output; one per world. Thread-safe."""

    def __init__(self, limit_lines: int = CELL_LINES, limit_bytes: int = CELL_BYTES,
                 workers: Callable[[], Iterable[int]] | None = None) -> None:
        """``workers``: the ranks that may print now (those a line waits for when no cell
        names its ranks)."""
        self.log_dir: str | None = None
        self.limit_lines, self.limit_bytes = limit_lines, limit_bytes
        self._ranks: dict[int, _RankOut] = {}
        self._lock = threading.RLock()
        self.muted = False
        self.jupyter = in_jupyter()
        self._terminal = _TerminalLive()
        self._workers = workers
        self._merge = Aggregator(AGGREGATE_WINDOW)
        self._aggregate = False  # the world's setting
        self._override: bool | None = None  # one cell's (``aggregating``)
        self._expected: frozenset[int] | None = None  # the running cell's ranks
        self._view: RankView | None = None  # takes its ranks' output (``viewing``)
        self._watch_cell_streams()

    # -- merging equal lines of many ranks ----------------------------------------------------
    @property
    def aggregate(self) -> bool:
        """Whether equal lines from several ranks are shown once (this cell's, or the
        world's setting)."""
        return self._aggregate if self._override is None else self._override

    @aggregate.setter
    def aggregate(self, on: bool) -> None:
        with self._lock:
            self._aggregate = bool(on)
            if not self.aggregate:
                self._emit(self._merge.release())

    @contextmanager
    def aggregating(self, on: bool | None, ranks: Iterable[int] | None = None) -> Iterator[None]:
        """Within: ``on`` overrides the world's setting (None: keep it) and a line waits only
        for ``ranks`` (a cell's); after, what is held is shown."""
        with self._lock:
            before = self._override, self._expected
            self._override = on if on is not None else self._override
            if ranks is not None:
                self._expected = frozenset(ranks)
            if not self.aggregate and len(self._merge):
                self._emit(self._merge.release())
        try:
            yield
        finally:
            with self._lock:
                self._emit(self._merge.release(self._expected, time.monotonic()))
                self._override, self._expected = before
                if not self.aggregate:
                    self._emit(self._merge.release())

    def release(self, ranks: Iterable[int] | None = None) -> None:
        """Show the held lines of ``ranks`` (None: all) now, before what follows them."""
        with self._lock:
            if len(self._merge):
                self._emit(self._merge.release(ranks, time.monotonic()))

    def next_due(self) -> float | None:
        """When a held line must be shown (``time.monotonic``), for the receiver's wake-up."""
        with self._lock:
            return self._merge.next_due()

    def _expect(self) -> frozenset[int] | None:
        if self._expected is not None:
            return self._expected
        return frozenset(self._workers()) if self._workers is not None else None

    def _emit(self, shown: list[Held]) -> None:
        """Write held lines, each led by its ranks, one write per run on a stream."""
        run: list[str] = []
        stream = ""
        for held in shown:
            if held.stream != stream and run:
                self.write(stream, "".join(run))
                run = []
            stream = held.stream
            names = [self._ranks[r].name for r in sorted(held.ranks)]
            label = names[0] if len(names) == 1 else rank_set(names)
            run.append(f"[{label}] {held.text}\n")
        if run:
            self.write(stream, "".join(run))

    def _echo(self, out: _RankOut, stream: str, lines: list[str]) -> None:
        """Show a rank's complete lines: at once, or through the merge when it is on."""
        now = time.monotonic()
        if now - out.rate_since >= 1.0:
            out.rate_since, out.rate_lines = now, 0
        out.rate_lines += len(lines)
        # off, or a flood (no one reads it line by line): as printed, after what is held
        if not self.aggregate or out.rate_lines > FLOOD_RATE:
            if len(self._merge):
                self._emit(self._merge.release(None if not self.aggregate else [out.rank],
                                               now))
            self.write(stream, "".join(f"[{out.name}] {s}\n" for s in lines))
            return
        expected = self._expect()
        for line in lines:
            self._emit(self._merge.add(out.rank, stream, line, now, expected))

    # -- a view per rank ------------------------------------------------------------------------
    @contextmanager
    def viewing(self, view: RankView) -> Iterator[None]:
        """Within: the output of the ranks ``view.takes`` goes to ``view``, not the stream."""
        self.flush()  # what came before shows before
        with self._lock:
            before, self._view = self._view, view
        try:
            yield
        finally:
            with self._lock:
                self._view = before

    def finished(self, rank: int, ok: bool) -> None:
        """A rank's cell ended (the receiver calls this): the view, if any, is told."""
        view = self._view
        if view is not None and view.takes(rank):
            view.finished(rank, ok)

    def _viewed(self, rank: int) -> bool:
        view = self._view
        return view is not None and view.takes(rank)

    def keep_logs_in(self, log_dir: str) -> None:
        """Write each rank's full log into ``log_dir`` (made private) from now on."""
        os.makedirs(log_dir, mode=0o700, exist_ok=True)
        self.log_dir = log_dir

    def _out(self, rank: int, name: str) -> _RankOut:
        out = self._ranks.get(rank)
        if out is None:
            out = self._ranks[rank] = _RankOut(rank, name, self.log_dir)
        return out

    # -- input --------------------------------------------------------------------------------
    def feed(self, rank: int, name: str, stream: str, text: str) -> None:
        """Text a rank wrote to ``stream``, in any chunking."""
        with self._lock:
            out = self._out(rank, name)
            if out.log is not None:
                out.log.write(text)
            if self._viewed(rank):
                self._view.output(rank, name, stream, text)  # type: ignore[union-attr]
            text = out.partial.pop(stream, "") + text
            *lines, tail = text.split("\n")
            while len(tail) > PARTIAL_LIMIT:  # a line without end is shown in pieces
                lines.append(tail[:PARTIAL_LIMIT])
                tail = tail[PARTIAL_LIMIT:]
            if lines:
                self._lines(out, stream, lines)
            if tail:
                out.partial[stream] = tail
                out.partial_at[stream] = time.monotonic()
                if "\r" in tail:
                    self._show_live(out, stream, tail)

    def _lines(self, out: _RankOut, stream: str, lines: list[str]) -> None:
        shown = [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in lines]
        out.tail.extend(shown)
        if stream in out.live:  # the live line ends as its final state
            live = out.live.pop(stream)
            out.live_at.pop(stream, None)
            final = f"[{out.name}] {shown[0]}"
            if live is not None:
                live.show(final)
            else:
                self._terminal.finish((out.rank, stream), final)
            shown = shown[1:]
        if self.muted or out.muted or not shown or self._viewed(out.rank):
            return
        keep = 0
        for line in shown:  # echo up to the cell's limit, not a line more
            if out.lines >= self.limit_lines or out.chars + len(line) > self.limit_bytes:
                out.muted = True
                break
            out.lines += 1
            out.chars += len(line)
            keep += 1
        if keep:
            self._echo(out, stream, shown[:keep])
        if out.muted:
            self._echo(out, "stderr", [f"nbdist: this rank printed more than this "
                                       f"cell's limit ({self.limit_lines:,} lines or "
                                       f"{self.limit_bytes / 2**20:g} MB); the rest is in its "
                                       f"log: `%dist_logs {out.name}`"])

    def _show_live(self, out: _RankOut, stream: str, tail: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - out.live_at.get(stream, 0.0) < LIVE_EVERY:
            return
        if self.muted or out.muted or self._viewed(out.rank):
            return
        state = tail.rsplit("\r", 1)[-1] or tail.rstrip("\r").rsplit("\r", 1)[-1]
        if stream not in out.live:
            if len(self._merge):  # its lines held for merging go above its live line
                self._emit(self._merge.release([out.rank], now))
            out.live[stream] = LiveLine() if self.jupyter else None
        live = out.live[stream]
        out.live_at[stream] = now
        if live is not None:
            live.show(f"[{out.name}] {state}")
        else:
            self._terminal.show((out.rank, stream), f"[{out.name}] {state}")

    # -- time passing -------------------------------------------------------------------------
    def tick(self) -> None:
        """Called often by the receiver: write lines held too long, catch live lines up."""
        now = time.monotonic()
        with self._lock:
            for out in self._ranks.values():
                for stream, tail in list(out.partial.items()):
                    if "\r" in tail:
                        if out.live_at.get(stream, 0.0) < out.partial_at[stream]:
                            self._show_live(out, stream, tail)
                    elif now - out.partial_at[stream] > PARTIAL_WAIT:
                        del out.partial[stream]
                        self._lines(out, stream, [tail])
            if len(self._merge):
                self._emit(self._merge.due(now))

    def flush(self, rank: int | None = None, release: bool = True) -> None:
        """Write out unfinished lines (all ranks, or one) and end their live lines; with
        ``release``, also the lines held for merging (a cell's last lines stay held until
        the cell ends, so that the other ranks' equal lines can join them)."""
        with self._lock:
            for out in self._ranks.values():
                if rank is not None and out.rank != rank:
                    continue
                for stream in list(out.partial):
                    self._lines(out, stream, [out.partial.pop(stream)])
                if out.log is not None:
                    out.log.flush()
            if release and len(self._merge):
                self._emit(self._merge.release(None if rank is None else [rank],
                                               time.monotonic()))

    def new_cell(self) -> None:
        """A new cell began: per-cell limits start over."""
        self._watch_cell_streams()
        with self._lock:
            for out in self._ranks.values():
                out.lines = out.chars = 0
                out.muted = False

    def _watch_cell_streams(self) -> None:
        """In Jupyter, the kernel's streams tell whether the notebook left a line open."""
        if self.jupyter:
            for stream in ("stdout", "stderr"):
                watch(cell_stream(stream))

    # -- reading back -------------------------------------------------------------------------
    def logs(self, rank: int, tail: int | None = 50) -> list[str]:
        """The last ``tail`` lines a rank wrote (None: all, from its log file)."""
        with self._lock:
            out = self._ranks.get(rank)
            if out is None:
                return []
            if tail is not None and tail <= TAIL_LINES:
                lines = list(out.tail)
                return lines[-tail:] if tail else []
            if out.log is None or out.log_path is None:
                return list(out.tail)
            out.log.flush()
            with open(out.log_path, encoding="utf-8", errors="replace", newline="") as f:
                lines = [line.rsplit("\r", 1)[-1] for line in f.read().split("\n")]
            if lines and lines[-1] == "":
                lines.pop()
            return lines[-tail:] if tail else lines

    def log_paths(self) -> dict[int, str]:
        with self._lock:
            return {r: o.log_path for r, o in self._ranks.items() if o.log_path}

    def close(self) -> None:
        """Close the log files (the world's directory, and with it the logs, goes at stop)."""
        with self._lock:
            for out in self._ranks.values():
                if out.log is not None:
                    out.log.close()
                    out.log = None

    @staticmethod
    def write(stream: str, text: str) -> None:
        """Write to the running cell (``cell_stream``), after the line the notebook's own code
        may be in the middle of (``line_guard``)."""
        target = cell_stream(stream)
        try:
            write_after(target, text)
            target.flush()
        except (ValueError, OSError):
            pass
