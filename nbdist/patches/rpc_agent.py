"""This process's RPC agent, through torch's private accessors (features ``current_agent``
and ``rpc_timeout`` in ``torch_private``): the one place nbdist reads or sets them."""

from __future__ import annotations

from typing import Any

from . import torch_private

__all__ = ["current", "set_default_timeout"]


def current() -> Any:
    """The running RPC agent of this process, or None when no RPC world is up (or this
    torch's accessors are not the ones nbdist knows)."""
    try:
        import torch.distributed.rpc as rpc
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if not rpc.is_available():  # pragma: no cover
        return None
    from torch.distributed.rpc import api

    if not torch_private.usable("current_agent") or not api._is_current_rpc_agent_set():
        return None
    try:
        return api._get_current_rpc_agent()
    except RuntimeError:  # shut down between the two calls
        return None


def set_default_timeout(seconds: float) -> bool:
    """The agent's default RPC timeout set to ``seconds`` (what ``init_rpc``'s options gave
    otherwise); False where this torch cannot (the feature is off)."""
    if not torch_private.usable("rpc_timeout"):
        return False
    import torch.distributed.rpc as rpc

    rpc._set_rpc_timeout(seconds)
    return True
