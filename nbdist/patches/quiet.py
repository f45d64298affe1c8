"""Keep torch's C++ log noise that nbdist itself causes out of the notebook.

torch logs straight to file descriptor 2, which Jupyter shows in the running cell:
- a ``pipe closed``/``eof`` warning per peer whenever a world ends or a worker dies (nbdist
  says itself, in words, when a worker dies); when it ends right after distributed autograd,
  a failed release of the autograd context on a peer already gone, and a reply not sent
  because the agent is shutting down;
- an error with a C++ stack trace when an RRef of an earlier, larger world is garbage-collected
  (its owner no longer exists; there is nothing to tell it).

``install()`` puts a filter thread between fd 2 and whatever fd 2 was (ipykernel's capture
pipe, or the terminal) that drops exactly those messages and passes everything else through.
"""

from __future__ import annotations

import os
import re
import threading

__all__ = ["MAX_PARTIAL", "NOISE_BLOCK", "NOISE_LINE", "filter_chunk", "filter_lines", "install",
           "installed"]

_PEER_GONE = rb"(pipe closed|eof|Connection reset by peer|connection closed)"
NOISE_LINE = re.compile(
    rb"tensorpipe_agent\.cpp.*encountered error .*" + _PEER_GONE
    + rb"|tensorpipe_agent\.cpp.*won't send response to request #\d+ to .*as the agent is "
      rb"shutting down"
    + rb"|container\.cpp.*Could not release Dist Autograd Context on node \d+: " + _PEER_GONE)
NOISE_BLOCK = re.compile(rb"Error occurred when deletingUserRRef|Detected RRef Leaks during "
                         rb"shutdown")
# a noise block goes on while lines look like the rest of a C++ trace
_BLOCK_TAIL = re.compile(rb"^(frame #\d+:|<omitting python frames>|Exception raised from|"
                         rb"Leaking RRef|\s*$)")

MAX_PARTIAL = 64 * 1024  # bytes of an unfinished line held back, at most
_installed = False


def filter_lines(lines: list[bytes], in_block: bool) -> tuple[list[bytes], bool]:
    """Drop noise from complete lines; ``in_block`` carries a C++ trace across calls."""
    keep = []
    for ln in lines:
        if in_block and _BLOCK_TAIL.match(ln):
            continue
        in_block = False
        if NOISE_BLOCK.search(ln):
            in_block = True
            continue
        if NOISE_LINE.search(ln):
            continue
        keep.append(ln)
    return keep, in_block


def install() -> None:
    """Filter this process's fd 2 from now on (idempotent; POSIX only)."""
    global _installed
    if _installed or os.name != "posix":
        return
    saved = os.dup(2)
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)
    threading.Thread(target=_pump, args=(r, saved), daemon=True,
                     name="nbdist-stderr-filter").start()
    _installed = True


def installed() -> bool:
    return _installed


def _pump(r: int, out: int) -> None:
    pending = b""
    in_block = False
    while True:
        try:
            data = os.read(r, 65536)
        except OSError:
            return
        if not data:
            return
        text, pending, in_block = filter_chunk(pending + data, in_block)
        if text:
            try:
                os.write(out, text)
            except OSError:
                pass


def filter_chunk(buf: bytes, in_block: bool) -> tuple[bytes, bytes, bool]:
    """Filter what arrived (``buf``: the held partial line plus new bytes).

    Returns ``(bytes to pass on, partial line to hold, in_block)``. A partial line is held
    only while it could still turn out to be noise, and never beyond ``MAX_PARTIAL`` bytes:
    a longer line is passed on in pieces.
    """
    *lines, pending = buf.split(b"\n")
    keep, in_block = filter_lines(lines, in_block)
    text = b"".join(ln + b"\n" for ln in keep)
    if pending and (len(pending) > MAX_PARTIAL or not (
            in_block or NOISE_BLOCK.search(pending) or pending.startswith(b"[")
            or pending.startswith(b"frame #"))):
        return text + pending, b"", in_block  # cannot be noise (or too long to hold)
    return text, pending, in_block
