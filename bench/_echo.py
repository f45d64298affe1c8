"""Importable echoes for the RPC benchmarks: plain torch processes pickle them by reference,
so that side measures RPC alone (nbdist's side uses copies defined in ``__main__``)."""

from __future__ import annotations

from typing import Any

__all__ = ["EchoBox", "echo", "held", "nbytes_of"]


def echo(x: Any) -> Any:
    """Return ``x``."""
    return x


class EchoBox:
    """An object to hold in an RRef and call through a proxy."""

    def echo(self, x: Any) -> Any:
        """Return ``x``."""
        return x


_HELD: dict = {}


def nbytes_of(x: Any) -> int:
    """A tensor's size: what a call that only sends ``x`` gets back."""
    return x.nbytes


def held(nbytes: int) -> Any:
    """The same float32 tensor of ``nbytes`` bytes on every call: a result that is only sent."""
    import torch

    t = _HELD.get(nbytes)
    if t is None:
        t = _HELD[nbytes] = torch.ones(max(nbytes // 4, 1))
    return t
