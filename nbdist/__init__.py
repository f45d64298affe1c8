"""nbdist: a PyTorch RPC world started from a notebook cell.

``%load_ext nbdist`` then ``%dist_start 4``: the notebook is rank 0, four worker processes are
ranks 1..4, and code defined in ordinary cells works in ``rpc_sync``/``rpc_async``/``remote``.
"""

from __future__ import annotations

from typing import Any

from . import linux  # noqa: F401  first: on another platform, one line instead of a failure later
from .cluster import Cluster, current, release_hosts, start, stop
from .cluster import spawn as _spawn
from .cluster.router import in_jupyter as _in_jupyter
from .errors import (
    CellInterrupted,
    ClusterStateError,
    DistCellError,
    DistTimeoutError,
    NbdistError,
    NoRpcError,
    RemoteError,
    StartError,
    WorkerDiedError,
)
from .telemetry.events import events
from .telemetry.records import clear_history, export_history, history, history_frame, log
from .telemetry.tracing import rpc_stats

__version__ = "0.1.0"

__all__ = [
    "CellInterrupted",
    "Cluster",
    "ClusterStateError",
    "DistCellError",
    "DistTimeoutError",
    "NbdistError",
    "NoRpcError",
    "RemoteError",
    "StartError",
    "WorkerDiedError",
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
    from .cluster.session import SESSION
    from .display.magic import register
    from .magics import DistMagics

    ipython.register_magics(DistMagics)
    register(ipython)
    ipython.events.register("pre_run_cell", _new_cell)
    _spawn.install()  # before the background import: it patches torch as torch is imported
    SESSION.prewarm()
    _check_torch()


def _check_torch() -> None:
    """One line per feature the torch at hand cannot support (its private names moved);
    the rest of nbdist works as usual. Only if torch's RPC is imported already, and done
    (not under way on the prewarm thread): ``%load_ext`` does not wait for ``import torch``
    (the first world start reports instead). Never raises: the check must not stop the start."""
    import sys

    from .cluster.session import SESSION
    from .cluster.warmup import MODULE, imported

    if SESSION.warmup.importing or not imported(MODULE):
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


if _in_jupyter():  # ``import nbdist`` in a kernel: mp.spawn of a cell's function works too,
    from .cluster.session import SESSION as _SESSION  # and the first world starts warm

    _spawn.install()
    _SESSION.prewarm()
