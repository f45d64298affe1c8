"""The public surface: what ``nbdist`` exports is what it should, and every module says so."""

from __future__ import annotations

import importlib
import pkgutil

import nbdist

EXPECTED = {
    "Cluster", "ClusterStateError", "DistCellError", "DistTimeoutError", "NbdistError",
    "RemoteError", "StartError", "WorkerDiedError", "__version__", "clear_history", "current",
    "dashboard", "export_history", "history", "history_frame", "load_ipython_extension", "log",
    "release_hosts", "rpc_stats", "start", "stop",
}


def test_top_level_exports():
    assert set(nbdist.__all__) == EXPECTED
    for name in nbdist.__all__:
        assert getattr(nbdist, name) is not None, name


def test_every_public_module_declares_all():
    missing = []
    for info in pkgutil.walk_packages(nbdist.__path__, "nbdist."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        mod = importlib.import_module(info.name)
        if not hasattr(mod, "__all__"):
            missing.append(info.name)
            continue
        for name in mod.__all__:
            assert hasattr(mod, name), f"{info.name}.__all__ names missing {name}"
    assert not missing, f"modules without __all__: {missing}"
