"""What this process has installed, once: patches of torch, of the process's stderr, and the
hooks they call.

A patch lasts as long as the process that installed it (torch's modules and file descriptors
are per process, not per world), so this record is the one place such state lives outside
``world_state``: each ``install()`` asks ``first_time(name)``, each hook is a field of
``hooks()``. A forked child inherits both, as it inherits the patched modules.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Hooks", "SyncTiming", "first_time", "forget", "has", "hooks"]

_DONE_PER_PROCESS: set[str] = set()
_LOCK_PER_PROCESS = threading.Lock()


def first_time(name: str) -> bool:
    """True once per process for ``name`` (the caller installs it then), False afterwards."""
    with _LOCK_PER_PROCESS:
        if name in _DONE_PER_PROCESS:
            return False
        _DONE_PER_PROCESS.add(name)
        return True


def forget(name: str) -> None:
    """``name`` was uninstalled: the next ``first_time(name)`` is True again."""
    with _LOCK_PER_PROCESS:
        _DONE_PER_PROCESS.discard(name)


def has(name: str) -> bool:
    """Whether ``name`` was installed in this process."""
    return name in _DONE_PER_PROCESS


@dataclass
class Hooks:
    """What the installed RPC patches call into, set by the process that owns them (the
    worker): ``after_call()`` when an RPC function returns, before its reply;
    ``on_failure(exc, traceback)`` for each exception one raised; ``sync_timing``: how the
    caller's one ``rpc_sync`` wrapper times each call for tracing."""

    after_call: Callable[[], None] | None = None
    on_failure: Callable[[BaseException, Any], None] | None = None
    sync_timing: SyncTiming | None = None


@dataclass
class SyncTiming:
    """Tracing's part of ``rpc_sync``, read inline on the hot path (no call unless timed):
    time the call where ``switch.on`` and not ``tls.paused``, by setting ``tls.sync``, and
    call ``end()`` as it returns."""

    switch: Any
    tls: Any
    end: Callable[[], None]


def hooks() -> Hooks:
    """The hooks this process's patches call."""
    return _HOOKS_PER_PROCESS


_HOOKS_PER_PROCESS = Hooks()
