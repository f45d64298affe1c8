"""nbdist: a PyTorch RPC world started from a notebook cell.

``%load_ext nbdist`` then ``%dist_start 4``: the notebook is rank 0, four worker processes are
ranks 1..4, and code defined in ordinary cells works in ``rpc_sync``/``rpc_async``/``remote``.
"""

from __future__ import annotations

from typing import Any

from . import linux  # noqa: F401  first: on another platform, one line instead of a failure later

# isort: split
from . import errors as _errors
from .cluster import Cluster, current, release_hosts, start, stop
from .errors import (
    CellInterrupted as CellInterrupted,
    ClusterStateError as ClusterStateError,
    DistCallError as DistCallError,
    DistCellError as DistCellError,
    DistTimeoutError as DistTimeoutError,
    NbdistError as NbdistError,
    NoRpcError as NoRpcError,
    RemoteError as RemoteError,
    StartError as StartError,
    WorkerDiedError as WorkerDiedError,
)
from .output.router import in_jupyter as _in_jupyter
from .patches import (
    on_import as _on_import,
    process_group as _process_group,
    rpc_rerun as _rpc_rerun,
)
from .spawn import in_world as _spawn
from .telemetry.events import events
from .telemetry.records import clear_history, export_history, history, history_frame, log
from .telemetry.tracing import rpc_stats

__version__ = "0.1.0"

__all__ = [  # the exceptions first (errors.RAISED), then the rest
    *_errors.RAISED,
    "Cluster",
    "__version__",
    "clear_history",
    "current",
    "dashboard",
    "device",
    "events",
    "export_history",
    "history",
    "history_frame",
    "load_ipython_extension",
    "log",
    "release_hosts",
    "rpc_stats",
    "start",
    "stop",
]


def __getattr__(name: str) -> Any:
    """``nbdist.dashboard`` imports the widget stack (matplotlib, ipywidgets) on first use."""
    if name == "dashboard":
        from .display import dashboard

        return dashboard
    raise AttributeError(f"module 'nbdist' has no attribute {name!r}")


def device() -> Any:
    """This rank's ``torch.device``: on a worker the GPU its world gave it (``cuda:i``) or
    the CPU; in the notebook, rank 0's GPU in the running world's plan (the notebook's
    current device stays yours to set), else the CPU."""
    import os

    import torch

    name = os.environ.get("NBDIST_DEVICE")  # set in every worker of a local world
    if name is None or os.environ.get("NBDIST_RANK") is None:
        c = current()
        name = c.device(0) if c is not None else None
    return torch.device(name or "cpu")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbdist``: register the magics, let ``mp.spawn`` run a cell's function in a
    world (unless ``NBDIST_SPAWN=0``), and launch the warm template and torch's import in the
    background (unless ``NBDIST_PREWARM=0``) so the first ``%dist_start`` is quick. Returns at
    once: nothing here imports torch."""
    from .cluster.session import session
    from .display.magic import register
    from .magics import DistMagics

    ipython.register_magics(DistMagics)
    register(ipython)
    ipython.events.register("pre_run_cell", _new_cell)
    ipython.events.register("pre_run_cell", _rpc_rerun.cell_started)
    ipython.events.register("post_run_cell", _rpc_rerun.after_cell)
    _on_import.after_import("torch.distributed.rpc", lambda _m: _rpc_rerun.install())
    _torch_first(ipython)
    _spawn.install()  # before the background import: it patches torch as torch is imported
    _process_group.install_on_import()  # so is init_process_group, for names bound early
    _check_torch()
    session().prewarm()  # last: its thread competes for the GIL


def _check_torch() -> None:
    """One line per feature the torch at hand cannot support (its private names moved);
    the rest of nbdist works as usual. Only if torch's RPC is imported already, and done
    (not under way on the prewarm thread): ``%load_ext`` does not wait for ``import torch``
    (the first world start reports instead). Never raises: the check must not stop the start."""
    import sys

    from .cluster.session import session
    from .cluster.warmup import MODULE, imported

    if session().warmup.importing or not imported(MODULE):
        return
    try:
        from .patches import torch_private

        lines = torch_private.report_once()
    except Exception as exc:  # noqa: BLE001
        lines = [f"nbdist: could not check this torch's private names ({exc!r})"]
    for line in lines:
        print(line, file=sys.stderr)


def _new_cell(*_: Any) -> None:
    """Each notebook cell starts the per-cell output limits over."""
    c = current()
    if c is not None:
        c.router.new_cell()


_TORCH_WAIT = 300.0  # s: a cell that names torch waits at most this long for the import


def _torch_first(ipython: Any) -> None:
    """Before each cell that names torch, let the background import of torch end (it does
    not wait otherwise): ``import torch.nn`` beside torch's own body would see a torch
    half-imported (``cluster/warmup.py``)."""
    from .cluster.session import session
    from .cluster.warmup import names_torch

    def wait(info: Any = None) -> None:
        if session().warmup.importing and names_torch(getattr(info, "raw_cell", "") or ""):
            session().warmup.wait(_TORCH_WAIT)

    callbacks = ipython.events.callbacks["pre_run_cell"]
    if not any(getattr(cb, "__qualname__", "") == wait.__qualname__ for cb in callbacks):
        ipython.events.register("pre_run_cell", wait)


def _after_this_cell(ipython: Any, action: Any) -> None:
    """Run ``action()`` once, when the cell running now has ended (``post_run_cell``)."""
    events = ipython.events

    def once(*_: Any) -> None:
        events.unregister("post_run_cell", once)
        action()

    events.register("post_run_cell", once)


if _in_jupyter():  # ``import nbdist`` in a kernel: mp.spawn of a cell's function works too,
    from .cluster.session import session as _session  # and the first world starts warm

    _spawn.install()
    _process_group.install_on_import()
    if _session().prewarm(import_here=False):  # the template now; torch here once the cell
        from IPython import get_ipython as _get_ipython  # (`%load_ext` maybe) has ended

        _torch_first(_get_ipython())
        _after_this_cell(_get_ipython(), _session().warmup.start)
