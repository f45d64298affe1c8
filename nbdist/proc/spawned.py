"""One rank's part of an ``mp.spawn`` run in a world: ``fn(i, *args)`` as a spawned process runs it.

The notebook pickles ``fn`` and ``args`` with the shipping rules (notebook functions and
classes by value, their globals mirrored into each rank's own ``__main__``) into a two-line
``%%dist`` cell (``cell``); on the worker that cell calls ``run``, which takes the payload out
of ``__main__`` again and calls ``fn(rank, *args)``. Rank 0 calls ``call`` directly.

A spawned process ends when its function does, and so does everything it made. A rank of a
world lives on, so ``call`` ends the default process group ``fn`` made and left behind
(a torchrun-style function never calls ``destroy_process_group``; a failed one never got
there), with ``destroy_process_group`` as the user would (nbdist's, in a world: the group is
kept until freeing it cannot freeze the process, so a peer still waiting in a collective with
this rank fails at the group's timeout). When ``fn`` raised, the locals of its finished frames
are cleared first (file and line stay for the traceback): its model and tensors go, as they
would with the process.
"""

from __future__ import annotations

import base64
import pickle
import sys
import traceback
from collections.abc import Callable

from ..patches import mirror, shipping

__all__ = ["PAYLOAD", "call", "cell", "run"]

PAYLOAD = "__nbdist_spawn__"  # the name the payload has in a worker's __main__, briefly


def cell(fn: Callable, args: tuple) -> str:
    """The ``%%dist`` cell that runs ``fn(rank, *args)`` on each worker it is sent to; a
    traceback shows only its second line."""
    blob = base64.b64encode(shipping.dumps((fn, args))).decode("ascii")
    return (f"{PAYLOAD} = {blob!r}\n"
            f"__import__('nbdist.proc.spawned', fromlist=['run']).run()\n")


def run() -> None:
    """On a worker, in the cell ``cell`` made: ``fn(rank, *args)``."""
    import os

    blob = mirror.main_namespace().pop(PAYLOAD)
    fn, args = pickle.loads(base64.b64decode(blob))
    call(fn, int(os.environ["NBDIST_RANK"]), args)


def call(fn: Callable, index: int, args: tuple) -> None:
    """``fn(index, *args)``; a process group it made is ended afterwards (see above).
    ``sys.exit()`` or ``sys.exit(0)`` in ``fn`` is a success, as for a spawned process."""
    before = _default_group()
    try:
        fn(index, *args)
    except BaseException as exc:
        if not isinstance(exc, SystemExit) or exc.code not in (None, 0):
            if _default_group() not in (None, before):
                traceback.clear_frames(exc.__traceback__)
                _end_group()
            raise
    if _default_group() not in (None, before):
        _end_group()


def _default_group() -> object | None:
    """The default process group now (None: none)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.group.WORLD


def _end_group() -> None:
    """End the default group the function left, the way its user would have
    (``destroy_process_group``: nbdist's, where a patch of its own stands in torch's place)."""
    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - its peers may be gone; say so, go on
        print(f"nbdist: could not end the process group the spawned function left: {exc}",
              file=sys.stderr)
