"""Behaviour 1: code defined in notebook cells works over torch RPC, with no magic."""

from __future__ import annotations

import pytest
from conftest import ev

TUTORIAL_STYLE = '''
import threading
import torch
import torch.distributed.rpc as rpc
from torch.distributed.rpc import RRef

SCALE = 10  # a module-level name the shipped code reads

def triple(x):
    return x * 3

class Counter:
    def __init__(self, start):
        self.value = start
    def add(self, k):
        self.value += k * SCALE
        return self.value
    def get(self):
        return self.value

class Box:
    def __init__(self, payload):
        self.payload = payload

def unbox(box):
    return Box(box.payload + 1)

class Agent:
    """The tutorial's shape: observers call back into the agent through an RRef."""
    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()
    @staticmethod
    def report(agent_rref, who, value):
        agent = agent_rref.local_value()
        with agent.lock:
            agent.seen.append((who, value))
        return len(agent.seen)

class Observer:
    def __init__(self):
        self.name = rpc.get_worker_info().name
    def run(self, agent_rref, n):
        return [rpc.rpc_sync(agent_rref.owner(), Agent.report, args=(agent_rref, self.name, i))
                for i in range(n)]

class Batcher:
    def __init__(self):
        self.fut = torch.futures.Future()
        self.calls = 0
        self.total = 0
    @staticmethod
    @rpc.functions.async_execution
    def update(rref, x):
        # calls may run in either order on the owner's thread pool: the answer must not care
        self = rref.local_value()
        self.calls += 1
        self.total += x
        fut = self.fut
        if self.calls == 2:
            self.fut = torch.futures.Future()
            fut.set_result(self.total * 100)
        return fut
'''


@pytest.fixture
def shell(ipython):
    ipython.run_line_magic("dist_start", "2 --name agent --worker-name obs{rank}")
    result = ipython.run_cell(TUTORIAL_STYLE)
    assert result.success
    return ipython


def test_notebook_function_in_rpc_sync_and_async(shell):
    assert ev(shell, "rpc.rpc_sync('obs1', triple, args=(torch.ones(2),))").tolist() == [3, 3]
    assert ev(shell, "rpc.rpc_async('obs2', triple, args=(7,)).wait()") == 21
    assert ev(shell, "rpc.rpc_sync('obs1', lambda a, b: a - b, args=(5, 2))") == 3


def test_notebook_class_as_remote_constructor_and_rref_proxies(shell):
    shell.run_cell("c = rpc.remote('obs2', Counter, args=(1,))")
    assert ev(shell, "c.rpc_sync().add(2)") == 21
    assert ev(shell, "c.rpc_async().add(1).wait()") == 31
    assert ev(shell, "c.remote().get().to_here()") == 31
    assert ev(shell, "c.to_here().value") == 31
    assert ev(shell, "type(c.to_here()).__name__") == "Counter"


def test_notebook_class_as_argument_and_return_value(shell):
    assert ev(shell, "rpc.rpc_sync('obs1', unbox, args=(Box(41),)).payload") == 42
    # cloudpickle tracks by-value classes, so the class comes back as the notebook's own
    assert ev(shell, "isinstance(rpc.rpc_sync('obs1', unbox, args=(Box(1),)), Box)") is True


def test_classes_referring_to_each_other_through_rrefs(shell):
    shell.run_cell("agent = Agent(); agent_rref = RRef(agent)\n"
                   "obs = [rpc.remote(f'obs{r}', Observer) for r in (1, 2)]\n"
                   "futs = [o.rpc_async().run(agent_rref, 3) for o in obs]\n"
                   "[f.wait() for f in futs]")
    seen = ev(shell, "sorted(agent.seen)")
    assert seen == [("obs1", 0), ("obs1", 1), ("obs1", 2), ("obs2", 0), ("obs2", 1),
                    ("obs2", 2)]


def test_async_execution_static_method(shell):
    shell.run_cell("b = rpc.remote('obs1', Batcher)\n"
                   "f1 = rpc.rpc_async('obs1', Batcher.update, args=(b, 1))\n"
                   "f2 = rpc.rpc_async('obs1', Batcher.update, args=(b, 2))")
    assert ev(shell, "f1.wait(), f2.wait()") == (300, 300)


def test_remote_traceback_shows_cell_source_and_rank(shell, capsys):
    shell.run_cell("def explode(x):\n    inner = x + 1\n    raise ValueError(f'bad value {inner}')")
    with pytest.raises(ValueError) as info:
        ev(shell, "rpc.rpc_sync('obs2', explode, args=(1,))")
    text = str(info.value)
    assert "bad value 2" in text
    assert "obs2" in text
    assert "raise ValueError(f'bad value {inner}')" in text  # the cell's line, from the worker
    assert "_run_function" not in text  # nbdist's and torch's frames are not the user's
    # raised once, not also printed remotely: after flush() whatever obs2 wrote has arrived
    import nbdist

    assert nbdist.current().flush(timeout=30)
    assert "[obs2]" not in capsys.readouterr().err


def test_unpicklable_argument_is_named(shell):
    with pytest.raises(TypeError) as info:
        ev(shell, "rpc.rpc_sync('obs1', triple, args=(1, threading.Lock()))")
    assert "argument 1 of the RPC to triple (lock)" in str(info.value)


def test_an_argument_torch_refuses_raises_torchs_own_error_type(shell):
    """A reducer that refuses on purpose (torch's own for a script RemoteModule raises
    RuntimeError) keeps its type and text, so code catching what torch raises still does."""
    shell.run_cell("class Refused:\n"
                   "    def __reduce__(self):\n"
                   "        raise RuntimeError('not over RPC, on purpose')")
    with pytest.raises(RuntimeError, match="not over RPC, on purpose") as info:
        ev(shell, "rpc.rpc_sync('obs1', triple, args=(Refused(),))")
    assert "argument 0 of the RPC to triple (Refused)" in str(info.value)


def test_submodule_scan_is_cached_but_still_correct(monkeypatch):
    import concurrent.futures  # noqa: F401
    import pickle
    import sys
    import types

    import cloudpickle

    from nbdist.shipping import pickler as shipping

    ns = {"__name__": "__main__"}  # as in a notebook cell
    exec("import concurrent\ndef f():\n    return concurrent.futures.ThreadPoolExecutor\n", ns)
    # nbdist's pickler asks its cache; cloudpickle's own function (Ray's, Dask's) stays
    assert cloudpickle.cloudpickle._find_imported_submodules is not shipping._cached_submodules
    blob = shipping.dumps(ns["f"])
    assert pickle.loads(blob)() is concurrent.futures.ThreadPoolExecutor
    # cached: shipping the same function again does not walk sys.modules again, until a
    # module is imported (what that saves per call is in bench/, not asserted here)
    scans = []
    real = shipping._find_submodules
    monkeypatch.setattr(shipping, "_find_submodules",
                        lambda code, deps: scans.append(code) or real(code, deps))
    exec("def g():\n    return concurrent.futures.Future\n", ns)
    shipping.dumps(ns["g"])
    first = len(scans)
    assert first >= 1
    for _ in range(5):
        assert pickle.loads(shipping.dumps(ns["g"]))() is concurrent.futures.Future
    assert len(scans) == first, "the scan was not cached"
    monkeypatch.setitem(sys.modules, "nbdist_test_new_module", types.ModuleType("x"))
    assert pickle.loads(shipping.dumps(ns["g"]))() is concurrent.futures.Future
    assert len(scans) > first, "a new module in sys.modules must invalidate the cache"


def test_cell_that_imported_rpc_functions_by_name_ships(shell):
    """``from torch.distributed.rpc import rpc_sync`` names nbdist's wrapper; it goes by name."""
    shell.run_cell("from torch.distributed.rpc import rpc_sync as _rs, remote as _rm\n"
                   "def relay(x):\n    return _rs('obs1', triple, args=(x,))\n")
    assert ev(shell, "rpc.rpc_sync('obs2', relay, args=(2,))") == 6
