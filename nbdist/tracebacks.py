"""A worker's traceback read as the user's code: its frames, which are nbdist's own, and the
short block per rank that Ctrl-C shows.

Pure functions over the text ``traceback.format_exception`` writes (what a worker sends).
The user's frame is the innermost one in a cell (``<dist-cell-N>``, a notebook cell's file)
or in a file outside Python's and the installed packages' directories; nbdist's own frames
and ``threading``'s are never it. ``NBDIST_TRACEBACK=full`` asks for every frame (``full``).
"""

from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["ENV", "Frame", "frames", "full", "is_own", "own_file", "short_block", "user_frame"]

ENV = "NBDIST_TRACEBACK"

_NBDIST = os.path.dirname(os.path.abspath(__file__)) + os.sep
_THREADING = os.sep + "threading.py"
_FILE = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+), in (?P<func>.*)$')


@dataclass(frozen=True)
class Frame:
    """One ``File "...", line N, in f`` entry and the source line under it ("" if none)."""

    file: str
    line: int
    func: str
    source: str = ""


def full() -> bool:
    """Whether ``NBDIST_TRACEBACK=full`` asks for every frame, nbdist's own included."""
    return os.environ.get(ENV, "").strip().lower() == "full"


def frames(text: str) -> list[Frame]:
    """The frames of a formatted traceback, outermost first (chained exceptions: the last)."""
    found: list[Frame] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            found = []
            continue
        m = _FILE.match(line)
        if m is None:
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        source = nxt.strip() if nxt.startswith("    ") and not _FILE.match(nxt) else ""
        found.append(Frame(m["file"], int(m["line"]), m["func"], source))
    return found


def own_file(path: str) -> bool:
    """A file of nbdist's machinery (or ``threading``), not of the user's code."""
    return path.startswith(_NBDIST) or path.endswith(_THREADING)


def is_own(frame: Frame) -> bool:
    """A frame of nbdist's machinery (or of ``threading``), not of the user's code."""
    return own_file(frame.file)


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(os.path.join(d, "") for d in sorted(dirs))


def _users(frame: Frame) -> bool:
    if is_own(frame):
        return False
    return frame.file.startswith("<") or not frame.file.startswith(_library_dirs())


def user_frame(found: list[Frame]) -> Frame | None:
    """The innermost frame of the user's code; else the innermost that is not nbdist's."""
    for f in reversed(found):
        if _users(f):
            return f
    for f in reversed(found):
        if not is_own(f):
            return f
    return None


def short_block(label: str, etype: str, message: str, text: str) -> list[str]:
    """Two lines for one rank: where its code was (file, line, function) and what it raised,
    then that line of its source; a library frame below the user's is named in passing."""
    found = frames(text)
    where = user_frame(found)
    what = f"{etype}: {message}" if message else etype
    if where is None:
        return [f"{label}: {what}"]
    head = f'{label}: {what}, at "{where.file}", line {where.line}, in {where.func}'
    inner = next((f for f in reversed(found) if not is_own(f)), where)
    if inner is not where:
        head += f" (inside {inner.func}, {os.path.basename(inner.file)}:{inner.line})"
    return [head, f"    {where.source}"] if where.source else [head]
