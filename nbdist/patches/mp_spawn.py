"""``torch.multiprocessing.spawn`` and ``start_processes`` asked of the world first.

``mp.spawn`` pickles ``fn`` by reference for fresh interpreters, so a function defined in a
notebook cell never reaches them. A wrapper in place of ``start_processes`` (in
``torch.multiprocessing`` and its ``spawn`` module) asks the taker ``attach`` registered whether
the world runs the call; ``DECLINE`` lets torch do it as usual. The patch is made as soon as
``torch.multiprocessing`` exists (at ``install``, or right after torch's import, by a
``sys.meta_path`` finder that then steps aside), so ``%load_ext nbdist`` need not import torch.
``NBDIST_SPAWN=0`` (read at every call) runs torch's own function.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..envflag import switched_on
from . import on_import
from .replaced import replace, restore

__all__ = ["DECLINE", "ENV", "attach", "install", "installed", "original", "uninstall"]

ENV = "NBDIST_SPAWN"
_PACKAGE = "torch.multiprocessing"
_MODULE = "torch.multiprocessing.spawn"


class _Decline:
    def __repr__(self) -> str:
        return "DECLINE"


DECLINE = _Decline()  # the taker's answer: torch runs the call itself

Taker = Callable[[Callable, tuple, int, bool, bool, str], Any]


@dataclass
class _SpawnPatch:
    """The patch of ``start_processes`` in this process, and who is asked at each call."""

    taker: Taker | None = None
    original: Callable | None = None  # torch's start_processes
    waiting: bool = False  # install asked for the patch (now, or once torch.multiprocessing is)
    lock: threading.Lock = field(default_factory=threading.Lock)


_PATCH_PER_PROCESS = _SpawnPatch()


def attach(taker: Taker) -> None:
    """``taker(fn, args, nprocs, join, daemon, start_method)`` is asked at every call; it
    returns what the call returns, or ``DECLINE``."""
    _PATCH_PER_PROCESS.taker = taker


def original() -> Callable | None:
    """torch's own ``start_processes`` (None until the patch is made)."""
    return _PATCH_PER_PROCESS.original


def installed() -> bool:
    """Whether torch's ``start_processes`` is replaced in this process."""
    return _PATCH_PER_PROCESS.original is not None


def install() -> None:
    """Patch now if ``torch.multiprocessing`` is imported, else right after it is (idempotent)."""
    with _PATCH_PER_PROCESS.lock:
        if _PATCH_PER_PROCESS.original is not None or _PATCH_PER_PROCESS.waiting:
            return
        _PATCH_PER_PROCESS.waiting = True
    on_import.after_import(_PACKAGE, _patch_package)


def _patch_package(package: Any) -> None:
    with _PATCH_PER_PROCESS.lock:
        if _MODULE in sys.modules:
            _patch()


def start_processes(fn: Callable, args: tuple = (), nprocs: int = 1, join: bool = True,
                    daemon: bool = False, start_method: str = "spawn") -> Any:
    """torch's ``start_processes``, run by nbdist's world where it takes the call."""
    taker, orig = _PATCH_PER_PROCESS.taker, _PATCH_PER_PROCESS.original
    assert orig is not None
    if taker is not None and switched_on(ENV):
        got = taker(fn, tuple(args), nprocs, join, daemon, start_method)
        if got is not DECLINE:
            return got
    return orig(fn, args, nprocs, join, daemon, start_method)


def _patch() -> None:
    """Replace ``start_processes`` where torch's code and users look it up."""
    module, package = sys.modules[_MODULE], sys.modules[_PACKAGE]
    orig = getattr(module, "start_processes", None)
    if not callable(orig) or orig is start_processes:
        return
    start_processes.__doc__ = orig.__doc__ or start_processes.__doc__
    _PATCH_PER_PROCESS.original = orig
    replace("spawn", module, "start_processes", start_processes)
    if getattr(package, "start_processes", None) is orig:
        replace("spawn", package, "start_processes", start_processes)


def uninstall() -> list[str]:
    """torch's own ``start_processes`` again; what stayed in place."""
    with _PATCH_PER_PROCESS.lock:
        left = restore("spawn")
        if not left:
            _PATCH_PER_PROCESS.original = None
            _PATCH_PER_PROCESS.waiting = False
    return left
