"""Keep torch's C++ log noise that nbdist itself causes out of the notebook.

``install()`` puts a filter thread between fd 2 and whatever fd 2 was (ipykernel's capture pipe
or the terminal) that drops exactly the messages ``filter_lines`` names (pipe-closed warnings
when a world ends, stale-RRef errors, ...) and passes everything else through;
``drop_stdout_noise`` does the same for Gloo's connect lines on stdout (torch 2.10 and older);
``hide_warnings()`` hides torch's per-rank deprecation warnings (user warnings still show).
Which messages and why: docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
import warnings
from typing import Any

from .installed import first_time, has

__all__ = ["GLOO_CONNECTED", "MAX_PARTIAL", "NOISE_BLOCK", "NOISE_LINE", "WARNINGS",
           "drop_stdout_noise", "filter_chunk", "filter_lines", "hide_warnings", "install",
           "installed"]

# TensorPipe says "EOF: end of file" over TCP (ranks on other hosts), "pipe closed" over shm
_PEER_GONE = rb"(?i:pipe closed|eof|Connection reset by peer|connection closed)"
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

GLOO_CONNECTED = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number "
                            r"of connected peer ranks is : \d+\n", re.MULTILINE)


def drop_stdout_noise(text: str, held: str = "") -> tuple[str, str]:
    """What a worker wrote to fd 1 (``held``: the part kept back last time, then ``text``)
    without Gloo's connection lines: ``(text to pass on, partial line to hold)``. Gloo may
    write its line in pieces, so an unfinished line that could be one is held (never long)."""
    text = held + text
    head, newline, tail = text.rpartition("\n")
    whole = head + newline
    if "[Gloo] Rank " in whole:
        whole = GLOO_CONNECTED.sub("", whole)
    if tail and len(tail) < 256 and (tail.startswith("[Gloo] ") or "[Gloo] ".startswith(tail)):
        return whole, tail
    return whole + tail, ""


MAX_PARTIAL = 64 * 1024  # bytes of an unfinished line held back, at most


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
    if os.name != "posix" or not first_time("quiet"):
        return
    saved = os.dup(2)
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)
    threading.Thread(target=_pump, args=(r, saved), daemon=True,
                     name="nbdist-stderr-filter").start()


def installed() -> bool:
    return has("quiet")


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


WARNINGS = (
    r".*ProcessGroupGloo.*",
    r".*TorchScript.*deprecat.*",
    r".*torch\.jit\..*deprecat.*",
    r".*`torch\.jit\.script` is deprecated.*",
)


_HIDDEN = re.compile("|".join(f"(?:{p})" for p in WARNINGS), re.I)  # as filterwarnings does


def _gate(show: Any) -> Any:
    """``warnings.showwarning`` that drops the messages of ``WARNINGS`` and passes the rest."""
    def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                    line: str | None = None) -> None:
        if not _HIDDEN.match(str(message)):
            show(message, category, filename, lineno, file, line)

    showwarning.nbdist_gate = True  # type: ignore[attr-defined]
    return showwarning


def hide_warnings() -> None:
    """Ignore torch's known per-rank deprecation warnings (user warnings still show).

    The filters alone do not last: torch's ``Join.__exit__`` calls
    ``warnings.simplefilter("once")`` for the whole process, which puts every warning ahead of
    them, so ``warnings.showwarning`` also drops those messages, whatever the filters say.
    The functional optimizers behind ``DistributedOptimizer`` warn inside their own
    ``catch_warnings(); simplefilter("always")``, which no filter can reach, so that one
    warning function is replaced by a no-op: at once if torch.distributed.optim is loaded,
    otherwise when it is (importing it costs about a second, so nbdist does not).
    """
    for pattern in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    if not getattr(warnings.showwarning, "nbdist_gate", False):
        warnings.showwarning = _gate(warnings.showwarning)
    if _DEPRECATION_MODULE in sys.modules:
        _silence_optimizer_warning()
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


_DEPRECATION_MODULE = "torch.distributed.optim._deprecation_warning"
_DEPRECATION_FUNC = "_scripted_functional_optimizer_deprecation_warning"


def _no_warning(stacklevel: int = 0) -> None:
    """Stands in for torch's TorchScript deprecation warning in the functional optimizers."""


def _silence_optimizer_warning() -> None:
    for modname, mod in list(sys.modules.items()):
        if modname.startswith("torch.distributed.optim") and hasattr(mod, _DEPRECATION_FUNC):
            setattr(mod, _DEPRECATION_FUNC, _no_warning)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Replaces the deprecation function as its module loads, before anyone imports it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _DEPRECATION_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            setattr(module, _DEPRECATION_FUNC, _no_warning)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
