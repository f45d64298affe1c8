"""An importable echo for the RPC latency benchmark: both nbdist and plain torch processes
pickle it by reference, so the comparison measures RPC, not function shipping."""

from __future__ import annotations

from typing import Any

__all__ = ["echo"]


def echo(x: Any) -> Any:
    """Return ``x``."""
    return x
