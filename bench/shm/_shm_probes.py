"""Timing probes around the shared-memory path's steps, for ``shm_fixed_cost.py``.

Imported by reference in every rank (a rank's ``__main__`` cannot hold them: wrapped
functions do not travel by value). ``install_probes`` wraps ``shm/transport.py``'s and
``shm/arena.py``'s steps in this process; ``records`` are ``(name, start ns, end ns,
minor faults)`` on ``time.monotonic_ns``, one clock for every process of a host.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from nbdist.shm import arena as arena_mod, transport as shm

__all__ = ["clear", "echo", "install_probes", "records", "remove_probes", "set_min_bytes",
           "set_pack_bytes", "set_threaded_copy"]

_now = time.monotonic_ns
_REC: list = []  # (name, start ns, end ns, minor faults during it), this process
_ORIG: dict = {}


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _probe(owner: Any, attr: str, name: str) -> None:
    orig = getattr(owner, attr)
    _ORIG[(owner, attr)] = orig

    def timed(*a: Any, **k: Any) -> Any:
        f0, t0 = _faults(), _now()
        try:
            return orig(*a, **k)
        finally:
            _REC.append((name, t0, _now(), _faults() - f0))

    setattr(owner, attr, timed)


def _mark(name: str) -> None:
    _REC.append((name, _now(), _now(), 0))


def install_probes() -> int:
    """Wrap the path's steps in this process with timing probes (``remove_probes`` undoes)."""
    if _ORIG:
        return os.getpid()
    _probe(shm, "_seal", "seal")
    _probe(arena_mod.Arena, "alloc", "claim")
    _probe(arena_mod.Arena, "written", "written")  # its start: the copy is done
    _probe(shm, "_decode", "decode")
    _probe(shm, "_peer", "map peer")
    _probe(arena_mod.PeerArena, "prefault", "prefault")
    _probe(arena_mod.PeerArena, "hold", "hold")
    _probe(arena_mod.PeerArena, "give_back", "free")
    return os.getpid()


def remove_probes() -> None:
    """Put the path's own functions back."""
    for (owner, attr), orig in _ORIG.items():
        setattr(owner, attr, orig)
    _ORIG.clear()
    _REC.clear()


def records() -> list:
    """This process's probe records since the last ``clear``."""
    return list(_REC)


def clear() -> None:
    _REC.clear()


def set_min_bytes(n: int) -> int:
    """The path's threshold in this process (a tensor smaller than ``n`` bytes keeps
    TensorPipe's path); returns the one before."""
    cfg = shm._current_config()
    if cfg is None:
        raise RuntimeError("the shared-memory path is off in this process")
    before, cfg.min_bytes = cfg.min_bytes, n
    return before


def set_pack_bytes(n: int) -> int:
    """The size from which a smaller tensor joins its message's span in this process (once
    the message met the threshold's bytes); returns the one before."""
    cfg = shm._current_config()
    if cfg is None:
        raise RuntimeError("the shared-memory path is off in this process")
    before, cfg.pack_bytes = cfg.pack_bytes, n
    return before


def echo(x: Any) -> Any:
    """Return ``x``, stamping entry and exit when probes are on."""
    if _ORIG:
        _mark("echo in")
    try:
        return x
    finally:
        if _ORIG:
            _mark("echo out")


def set_threaded_copy(on: bool) -> bool:
    """Whether every span is copied into a slot by torch's threads (as before issue 35) in
    this process, instead of by one ``memmove`` below ``shm._THREADED_COPY_MIN``."""
    global _copy_min
    if _copy_min is None:
        _copy_min = shm._THREADED_COPY_MIN
    shm._THREADED_COPY_MIN = 0 if on else _copy_min
    return on


_copy_min: int | None = None
