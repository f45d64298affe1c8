"""The public surface: what ``nbdist`` exports is what it should, and every module says so."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import nbdist

EXPECTED = {
    "CellInterrupted", "Cluster", "ClusterStateError", "DistCallError", "DistCellError",
    "DistTimeoutError", "NbdistError", "NoRpcError", "RemoteError", "StartError",
    "WorkerDiedError", "__version__", "clear_history", "current", "dashboard", "device",
    "events", "export_history", "history", "history_frame", "load_ipython_extension", "log",
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


def test_template_and_host_agent_are_launchers():
    """The world forks through either one behind ``launch.Launcher`` (launch, poll, kill, close)."""
    from nbdist.hosts import netif
    from nbdist.hosts.host_agents import HostAgent
    from nbdist.hosts.launch import Launcher, Template

    assert isinstance(Template("/nonexistent"), Launcher)
    agent = HostAgent("node1", "ssh", "python3", netif.resolve("lo"))
    assert isinstance(agent, Launcher) and not agent.alive()


def test_rpc_hooks_attach_one_world_whole():
    """A world is attached to rank 0's RPC calls as one object and detached as one."""
    from nbdist.patches import rpc_hooks

    class Dead:
        def check_dest(self, dest):
            raise RuntimeError(f"{dest} is dead")

        def interrupted(self, dest, fut=None):
            pass

        def replied(self, dest):
            pass

        def locate(self, dest):
            return None

    class Fut:
        def done(self):
            return False

        def add_done_callback(self, fn):
            pass

    rpc_hooks.attach(Dead())
    try:
        with pytest.raises(RuntimeError, match="obs1 is dead"):
            rpc_hooks.wait_future(Fut(), "obs1")
    finally:
        rpc_hooks.detach()
