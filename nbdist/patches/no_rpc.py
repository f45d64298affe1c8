"""Worlds without torch RPC: what an RPC call says in one.

A world started with ``--no-rpc`` (or on a torch build without ``torch.distributed.rpc``) has
a process group and nbdist's control channel, and no RPC agent on any rank. While this
process is in such a world (``enter`` .. ``leave``), ``check`` raises ``NoRpcError``, and so
do torch's own RPC calls (``rpc_sync``, ``rpc_async``, ``remote``, ``get_worker_info``, even
when imported before the world started) instead of "RPC has not been initialized": each asks
``api._is_current_rpc_agent_set`` from ``_require_initialized``'s wrapper, and that one
question, from that one caller, is answered here. Any other caller gets torch's answer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..errors import NoRpcError
from . import torch_private
from .replaced import replace, restore

__all__ = ["BUILD", "FLAG", "active", "agent_set", "check", "enter", "leave"]

FLAG = ("this world was started with --no-rpc (no torch RPC agent); start it without "
        "--no-rpc to use RPC")
BUILD = ("this torch build has no torch.distributed.rpc, so this world has no RPC agent; "
         "install a torch build with it to use RPC")


@dataclass
class _NoRpc:
    """Why this process's world has no RPC (``reason``, per world: None when it has, or there
    is no world), and torch's own ``_is_current_rpc_agent_set`` while ours stands in for it."""

    reason: str | None = None
    original: Any = None
    torch: Any = None  # torch's own, kept: a stale reference to ours still gets its answer
    wrapper_code: Any = None


_NO_RPC_PER_PROCESS = _NoRpc()


def active() -> str | None:
    """Why this process's world has no RPC, or None when it has (or there is no world)."""
    return _NO_RPC_PER_PROCESS.reason


def check(what: str) -> None:
    """Raise ``NoRpcError`` saying ``what`` needs RPC, when this world has none."""
    if _NO_RPC_PER_PROCESS.reason is not None:
        raise NoRpcError(f"{what} needs torch RPC: {_NO_RPC_PER_PROCESS.reason}")


def enter(reason: str) -> None:
    """This process is now in a world without RPC, for ``reason`` (``FLAG`` or ``BUILD``)."""
    _NO_RPC_PER_PROCESS.reason = reason
    if _NO_RPC_PER_PROCESS.original is None and torch_private.usable("no_rpc"):
        from torch.distributed.rpc import api

        _NO_RPC_PER_PROCESS.wrapper_code = api._require_initialized(lambda: None).__code__
        _NO_RPC_PER_PROCESS.original = _NO_RPC_PER_PROCESS.torch = replace(
            "no_rpc", api, "_is_current_rpc_agent_set", _is_current_rpc_agent_set)


def leave() -> list[str]:
    """The world without RPC has ended: torch's RPC calls answer as torch's own again (this
    feature's uninstall); what stayed in place (another feature's wrapper on top)."""
    _NO_RPC_PER_PROCESS.reason = None
    left = restore("no_rpc") if _NO_RPC_PER_PROCESS.original is not None else []
    if not left:
        _NO_RPC_PER_PROCESS.original = None
    return left


def agent_set() -> bool:
    """torch's own answer: whether an RPC agent runs in this process (False without RPC)."""
    if _NO_RPC_PER_PROCESS.torch is not None:
        return bool(_NO_RPC_PER_PROCESS.torch())
    if not torch_private.usable("no_rpc"):
        return False
    from torch.distributed.rpc import api

    return bool(api._is_current_rpc_agent_set())


def _is_current_rpc_agent_set() -> bool:
    """torch's answer, except to ``_require_initialized`` in a world without RPC: raise."""
    if _NO_RPC_PER_PROCESS.torch():
        return True
    caller = sys._getframe(1)
    if _NO_RPC_PER_PROCESS.reason is not None and caller.f_code is _NO_RPC_PER_PROCESS.wrapper_code:
        func = caller.f_locals.get("func")
        name = getattr(func, "__name__", "this call")
        # torch's own words first: code that matches them (torch's tests, a script's
        # except clause) still does
        raise NoRpcError(f"RPC has not been initialized. torch.distributed.rpc.{name} needs "
                         f"torch RPC: {_NO_RPC_PER_PROCESS.reason}")
    return False
