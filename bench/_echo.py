"""Importable echoes for the RPC benchmarks: plain torch processes pickle them by reference,
so that side measures RPC alone (nbdist's side uses copies defined in ``__main__``)."""

from __future__ import annotations

from typing import Any

__all__ = ["EchoBox", "echo"]


def echo(x: Any) -> Any:
    """Return ``x``."""
    return x


class EchoBox:
    """An object to hold in an RRef and call through a proxy."""

    def echo(self, x: Any) -> Any:
        """Return ``x``."""
        return x
