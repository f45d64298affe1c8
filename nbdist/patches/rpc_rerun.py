"""A cell with its own ``init_rpc`` ... ``shutdown`` runs again as a fresh process's would.

torch keeps per-process RPC state past ``rpc.shutdown()`` that a script never meets twice: the
RRef context (marked destroyed and still holding the old agent, so the next run's RRefs are
never released and its shutdown waits: "Timed out waiting for pending OwnerRRefs"), the last
rendezvous, the all-gather sequence numbers, and the distributed autograd context a run that
never left it keeps current on its thread ("Already have an autograd context id for this
thread"). ``install()`` wraps ``rpc.init_rpc``: with no agent up, that state is forgotten
first (an agent an earlier cell started and left up is shut down first, locally, and said);
so is it when the next cell starts (``cell_started``), as the next run of a script is a
fresh process (an ``RRef`` made there before any ``init_rpc`` raises "Current RPC agent is not
set"; within one run torch's own behaviour after ``shutdown`` is kept). In a world cell the
first ``init_rpc`` numbers its keys from the cell's id (``world_cell``), the same on ranks
kept through a ``--keep`` restart and on new ones, whose own counts differ. A cell that fails with
an agent it started still up ends that agent (``cell_ended``), as the failed script's process
would have ended.
"""

from __future__ import annotations

import functools
import gc
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from .replaced import replace, restore

__all__ = ["CELL_KEYS", "after_cell", "cell_ended", "cell_started", "end_agent", "install",
           "keys_named_here", "started_here", "uninstall", "world_agent_joins", "world_cell"]


@dataclass
class _UserAgent:
    """The agent user code started in this process (per process: one agent at a time)."""

    ran: bool = False  # user code started an agent since its state was last forgotten
    up: bool = False  # the user's last init_rpc set the agent up now, even one that then
    # failed; never the world's (no reference is kept: a shut-down agent holds its store, and
    # rank 0's store is a listening TCP server)
    this_cell: bool = False  # made by the cell running now
    installed: bool = False
    keys_of: object = None  # the world cell whose first init_rpc set ``_init_counter``
    backends: Any = None  # torch's ``BackendType`` as this process had it before user code


_AGENT_PER_PROCESS = _UserAgent()
#: the first ``init_rpc`` of a world cell names its rendezvous keys from the cell's id, the
#: same on every rank, kept or new: a rank kept through ``%dist_restart --keep`` has counted
#: every earlier ``init_rpc``, a new one none, and torch's ``rpc_prefix_<count>`` keys would
#: not meet. Far above torch's own count and ``spawn``'s keys; each cell has 2**16 inits.
CELL_KEYS = 1 << 32
END_TIMEOUT = 30.0  # seconds the agent of a failed cell has to shut down
_LOCK_PER_PROCESS = threading.Lock()


def install() -> None:
    """Wrap ``torch.distributed.rpc.init_rpc`` (once per process; needs torch's RPC)."""
    import torch.distributed.rpc as rpc

    with _LOCK_PER_PROCESS:
        if _AGENT_PER_PROCESS.installed or not rpc.is_available():
            return
        _AGENT_PER_PROCESS.installed = True
        _AGENT_PER_PROCESS.backends = rpc.backend_registry.BackendType
        replace("rerun", rpc, "init_rpc", _wrap(rpc.init_rpc))


def uninstall() -> list[str]:
    """torch's own ``init_rpc`` again; what stayed in place."""
    with _LOCK_PER_PROCESS:
        left = restore("rerun")
        if not left:
            _AGENT_PER_PROCESS.installed = False
    return left


def _wrap(init_rpc: Any) -> Any:
    @functools.wraps(init_rpc)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from torch.distributed.rpc import api

        from . import torch_private

        if not (torch_private.usable("rerun") and torch_private.usable("restart")):
            return init_rpc(*args, **kwargs)  # said at %load_ext: a second run may hang
        if not _AGENT_PER_PROCESS.this_cell and started_here():  # an earlier cell's
            end_agent()
            print("nbdist: the RPC agent an earlier cell's init_rpc started was still up; it "
                  "was shut down here (without waiting for peers), so this init_rpc starts "
                  "afresh, as the script's next run would", file=sys.stderr)
        before = bool(api._is_current_rpc_agent_set())  # the world's: torch refuses below
        if not before:
            _forget_last_agent(_cell_keys())
        _AGENT_PER_PROCESS.ran = True
        try:
            result = init_rpc(*args, **kwargs)
        finally:  # one that failed after setting its agent (a refused dynamic member) too
            if not before and api._is_current_rpc_agent_set():
                _AGENT_PER_PROCESS.up = True
        _AGENT_PER_PROCESS.this_cell = True
        return result

    wrapper.__nbdist_wrapped__ = init_rpc  # type: ignore[attr-defined]
    return wrapper


def _forget_last_agent(init_count: int | None = None) -> None:
    """What an earlier agent of this process left: its RRef context, rendezvous and
    all-gather counters. ``init_count``: the next ``init_rpc``'s keys count from there and
    its shutdown barrier's from 0 (``rpc_barrier``); None keeps torch's counts (the world's
    store may hold keys of theirs).

    torch's distributed autograd container is kept, with contexts an earlier run left: a new
    one restarts its context ids, which torch's engine still holds for those contexts
    ('initializedContextIds_' assert in ``dist_autograd.backward``)."""
    from . import rpc_barrier, rpc_hooks, rref_reset

    _AGENT_PER_PROCESS.up = _AGENT_PER_PROCESS.ran = False
    rref_reset.reset_singleton()
    rpc_hooks.reset_world_state(init_count or 0, keep_init_counter=init_count is None)
    _leave_autograd_context()
    if init_count is not None:
        rpc_barrier.restart()
    gc.collect()  # the last rendezvous's store (a TCP server on rank 0) must not serve on


def world_cell() -> int | None:
    """The id of the world cell this process runs now, the same on every rank of the world
    (a ``%%dist`` cell's id; rank 0's under ``--local``); None outside one."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return None
    return getattr(shell, "nbdist_local_exec_id", None) or getattr(shell, "nbdist_exec_id", None)


def _cell_keys() -> int | None:
    """Where a world cell's first ``init_rpc`` counts its keys from: the cell's id, so every
    rank names them alike (``CELL_KEYS``), kept or new; None outside a world cell and for
    the cell's later inits, which count on as torch does."""
    cell = world_cell()
    if cell is None or _AGENT_PER_PROCESS.keys_of == cell:
        return None
    _AGENT_PER_PROCESS.keys_of = cell
    return CELL_KEYS + (cell << 16)


def keys_named_here() -> None:
    """The caller numbered this cell's ``init_rpc`` keys alike on every rank (``mp.spawn``
    in a world: by the spawn's generation); the cell's own numbering is not applied."""
    _AGENT_PER_PROCESS.keys_of = world_cell()


def _leave_autograd_context() -> None:
    """Release the distributed autograd context an earlier run left current on this thread
    (one that exited inside ``dist_autograd.context()``, or made one with ``_new_context``):
    a fresh process has none, and ``context()`` refuses to open a second."""
    try:
        import torch.distributed.autograd as dist_autograd

        context_id = dist_autograd._current_context()._context_id()
    except Exception:  # noqa: BLE001 - none current (the usual case), or never initialised
        return
    try:
        dist_autograd._release_context(context_id)
    except Exception:  # noqa: BLE001 - released meanwhile
        pass


def world_agent_joins() -> None:
    """nbdist's own agent is about to be current (a world with RPC): none is the user's."""
    _AGENT_PER_PROCESS.up = False


def started_here() -> bool:
    """Whether an agent user code started in this process is up now."""
    from torch.distributed.rpc import api

    return _AGENT_PER_PROCESS.up and bool(api._is_current_rpc_agent_set())


def cell_started(*_: Any) -> None:
    """A cell starts: an agent up now is an earlier cell's; with none up, what an earlier
    cell's agent left is forgotten, as a script's next run starts in a fresh process."""
    _AGENT_PER_PROCESS.this_cell = False
    if not _AGENT_PER_PROCESS.ran:  # the usual cell: no import, no call into torch
        return
    from torch.distributed.rpc import api

    if not api._is_current_rpc_agent_set():
        _forget_last_agent()
        _forget_registered_backends()


def _forget_registered_backends() -> None:
    """RPC backends an earlier run registered go, as in a fresh process: torch's
    ``register_backend`` rebinds ``backend_registry.BackendType`` to a new enum, and after it
    ``rpc.BackendType.TENSORPIPE`` (the old enum's) fails ``init_rpc``'s check ("Argument backend
    must be a member of BackendType"); a run that registers its backend again would meet
    "already registered". Only at a cell's start: a cell may register one and use it."""
    from torch.distributed.rpc import backend_registry

    fresh = _AGENT_PER_PROCESS.backends
    if fresh is not None and backend_registry.BackendType is not fresh:
        backend_registry.BackendType = fresh


def cell_ended(failed: bool) -> None:
    """A cell ended: if it ``failed`` and the agent it started is still up, shut that agent
    down here, without waiting for peers, and say so."""
    this_cell, _AGENT_PER_PROCESS.this_cell = _AGENT_PER_PROCESS.this_cell, False
    if not (failed and this_cell):
        return
    while True:  # a Ctrl-C here (fail-fast interrupting this rank too) must not skip it
        try:
            if started_here():
                end_agent()
                print("nbdist: the cell failed with the RPC agent its init_rpc started still "
                      "up; it was shut down here, as the script's process would have ended",
                      file=sys.stderr)
            return
        except KeyboardInterrupt:
            continue


def after_cell(result: Any) -> None:
    """``cell_ended`` as IPython's ``post_run_cell`` callback (the notebook's shell)."""
    if _AGENT_PER_PROCESS.this_cell:
        cell_ended(not result.success)


def end_agent(timeout: float = END_TIMEOUT) -> None:
    """Shut down the agent user code started, locally (peers are not waited for), ignoring
    RRef leaks as a process that ends does. It runs on a thread of its own, waited for up to
    ``timeout``: a Ctrl-C (nbdist's fail-fast interrupts the other ranks of a failed cell)
    cannot cut torch's shutdown in half and leave the agent set."""
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc import api

    def shut() -> None:
        ignore = api._ignore_rref_leak
        api._ignore_rref_leak = True
        try:
            rpc.shutdown(graceful=False)
        except Exception:  # noqa: BLE001 - its peers gone, or it ended meanwhile
            pass
        finally:
            api._ignore_rref_leak = ignore

    thread = threading.Thread(target=shut, name="nbdist-end-agent", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        try:
            thread.join(0.1)
        except KeyboardInterrupt:  # the agent ends either way; the cell already failed
            continue
    _AGENT_PER_PROCESS.up = False
    if thread.is_alive():
        print(f"nbdist: the RPC agent of the failed cell did not shut down within {timeout:g}s",
              file=sys.stderr)
