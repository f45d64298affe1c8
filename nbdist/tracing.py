"""RPC tracing: time every RPC the user's code makes (filled in by the dashboard work)."""

from __future__ import annotations

__all__ = ["install"]


def install(rank: int, name: str) -> None:
    """Start timing RPCs made from this rank (called on every rank as it joins a world)."""
