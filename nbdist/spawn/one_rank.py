"""One rank's part of an ``mp.spawn`` run in a world: ``fn(i, *args)`` as a spawned process runs it.

The notebook pickles ``fn`` and ``args`` by the shipping rules into a two-line ``%%dist`` cell
(``cell``); on the worker that cell calls ``run``, which takes them out of ``__main__`` and calls
``fn(rank, *args)``. Rank 0 calls ``call`` directly.

``call`` gives ``fn`` what a spawned process has: no process group (the rank's are hidden by
``patches.hidden_groups``) and, in a world without RPC, leave to ``init_rpc`` anew. A rank lives on
after ``fn``, so ``call`` then ends what the process's exit would: its changes to the environment,
an RPC agent it left (non-graceful), the default group it left (with ``destroy_process_group``, so
the group is kept until freeing it is safe) and, when ``fn`` raised, its finished frames' locals.
"""

from __future__ import annotations

import base64
import os
import pickle
import sys
import traceback
from collections.abc import Callable

from ..patches import hidden_groups, no_rpc, rpc_barrier, rpc_hooks, rpc_rerun, rref_reset
from ..shipping import own_main, pickler as shipping

__all__ = ["PAYLOAD", "call", "cell", "run"]

PAYLOAD = "__nbdist_spawn__"  # the name the payload has in a worker's __main__, briefly
# The first of the numbers that name a spawned function's ``init_rpc`` keys (torch's
# ``rpc_prefix_N``), one per spawn: torch keeps an ``init_method="tcp://..."`` store serving
# in the process that hosted it (rank 0, the notebook) after ``rpc.shutdown()``, so the next
# spawn's ranks may meet in that same store, and must not find the last one's keys there.
RPC_KEYS = 1 << 20


def cell(fn: Callable, args: tuple, generation: int = 0) -> str:
    """The ``%%dist`` cell that runs ``fn(rank, *args)`` on each worker it is sent to, as
    spawn number ``generation``; a traceback shows only its second line."""
    blob = base64.b64encode(shipping.dumps((fn, args, generation))).decode("ascii")
    return (f"{PAYLOAD} = {blob!r}\n"
            f"__import__('nbdist.spawn.one_rank', fromlist=['run']).run()\n")


def run() -> None:
    """On a worker, in the cell ``cell`` made: ``fn(rank, *args)``."""
    blob = own_main.main_namespace().pop(PAYLOAD)
    with own_main.sender_wins():  # the notebook's globals, as a child's
        fn, args, generation = pickle.loads(base64.b64decode(blob))
    call(fn, int(os.environ["NBDIST_RANK"]), args, generation)


def call(fn: Callable, index: int, args: tuple, generation: int = 0) -> None:
    """``fn(index, *args)`` in a process that looks freshly spawned, and what it made and
    left is ended afterwards (see above); ``generation``: this spawn's number, the same on
    every rank. ``sys.exit()`` or ``sys.exit(0)`` in ``fn`` is a success, as for a spawned
    process."""
    hidden = hidden_groups.hide()
    own_rpc = no_rpc.active() is not None and not no_rpc.agent_set()
    if own_rpc:  # fn may call init_rpc as a fresh process does (rendezvous keys: below)
        rpc_hooks.reset_world_state(RPC_KEYS + generation)
        rref_reset.reset_singleton()
        rpc_barrier.restart()
        rpc_rerun.keys_named_here()  # the spawn's numbers stand for this cell's init_rpc
    before = _default_group()
    environ = dict(os.environ)  # what fn sets there (MASTER_PORT...) ends with it, as a child's
    try:
        try:
            fn(index, *args)
        except BaseException as exc:
            if not isinstance(exc, SystemExit) or exc.code not in (None, 0):
                if _default_group() not in (None, before) or (own_rpc and no_rpc.agent_set()):
                    traceback.clear_frames(exc.__traceback__)
                _end_what_it_left(before, own_rpc)
                raise
        _end_what_it_left(before, own_rpc)
    finally:
        _restore(environ)
        if hidden is not None and not hidden.restore():
            print("nbdist: the spawned function left a default process group that could not "
                  "be ended, so this rank's own group stays hidden", file=sys.stderr)


def _restore(environ: dict[str, str]) -> None:
    """This process's environment as it was before the function ran."""
    for key in [k for k in os.environ if k not in environ]:
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _end_what_it_left(before: object | None, own_rpc: bool) -> None:
    if _default_group() not in (None, before):
        _end_group()
    if own_rpc:
        if no_rpc.agent_set():
            _end_rpc()
        rpc_hooks.reset_world_state()  # its rendezvous store stops serving here, not later
        rref_reset.reset_singleton()


def _end_rpc() -> None:
    """End the RPC agent the function started and left (no ``rpc.shutdown()``), without
    waiting for its peers, as its process's exit would."""
    import torch.distributed.rpc as rpc

    try:
        rpc.shutdown(graceful=False)
    except Exception as exc:  # noqa: BLE001 - its peers may be gone; say so, go on
        print(f"nbdist: could not end the RPC agent the spawned function left: {exc}",
              file=sys.stderr)


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
