"""Bound the Gloo group torch's ``init_rpc`` builds while rank 0 joins a world.

``init_rpc`` gives that group ``rpc.constants.DEFAULT_PROCESS_GROUP_TIMEOUT`` (24 days), read
when it builds the group; ``bounded(seconds)`` sets it for the join and puts torch's value back
after (feature ``start_timeout``: where the name moved, the join keeps torch's timeout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

from .replaced import replace, restore
from .torch_private import usable

__all__ = ["bounded"]


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """torch's RPC start-up Gloo group waits at most ``seconds`` while this block runs."""
    if not usable("start_timeout"):
        yield
        return
    from torch.distributed.rpc import constants

    replace("start_timeout", constants, "DEFAULT_PROCESS_GROUP_TIMEOUT",
            timedelta(seconds=seconds))
    try:
        yield
    finally:
        restore("start_timeout")
