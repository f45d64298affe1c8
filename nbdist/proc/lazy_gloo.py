"""The Gloo group inside torch's ``init_rpc`` connects only the pairs it uses.

``init_rpc`` builds a Gloo group over the whole world to gather device maps and for one
barrier, then drops it. By default Gloo connects every pair of ranks as the group is made:
N*(N-1)/2 connections, 32,640 at 256 ranks, most never used (the gather is a ring, the
barrier a few rounds). torch's ``TORCH_GLOO_LAZY_INIT=1`` connects a pair on its first
message instead. ``lazy_connections`` sets it for the length of ``init_rpc`` only: a group
user code makes later gets torch's default, and a value the user set is left as it is. A
torch that does not know the variable ignores it.

Only a world on one machine asks for it (its rendezvous is a file store): across hosts,
where the ranks meet at the notebook's store (``proc.store``), lazily connected pairs of a
4 x 8 world once waited out the store's deadline in the group's barrier, an 8 x 32 world
failed its one lazy start (its full mesh: 14 of 14), and an 8 x 16 world started no sooner
lazily (34.9-37.3 s against 33.5 s), so those worlds keep Gloo's full mesh. Every rank
of a world must agree: a rank that connects every pair waits for peers that never come.

Measured on 2 cores (``bench/results/notes.md``): a 64-rank restart 3.4 -> 2.8 s (medians
of 3 rounds); at 256 ranks, start and restart were shorter in 5 of 6 pairs, by up to half.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["VARIABLE", "lazy_connections"]

VARIABLE = "TORCH_GLOO_LAZY_INIT"


@contextlib.contextmanager
def lazy_connections() -> Iterator[None]:
    """``TORCH_GLOO_LAZY_INIT=1`` inside the block, unless this process's environment names
    it already; as it was after."""
    if VARIABLE in os.environ:
        yield
        return
    os.environ[VARIABLE] = "1"
    try:
        yield
    finally:
        os.environ.pop(VARIABLE, None)
