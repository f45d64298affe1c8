"""RPC tracing: every kind of user RPC on every rank is counted, timed and sized; rpc_stats
gathers the workers' calls on rank 0; tracing can be switched off everywhere."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import wait_until

from nbdist.telemetry import tracing


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, x):
        self.n += 1
        return x + self.n


def echo(x):
    return x


def zeros(n):
    return torch.zeros(n)


def _wait_total(n: int, timeout: float = 5.0, **filters) -> tracing.RpcStats:
    """The traces once ``n`` calls have arrived (rank 0's own calls are recorded as their
    futures complete, workers' calls arrive with their records)."""
    def enough():
        stats = tracing.rpc_stats(**filters)
        return stats if stats.total() >= n else None

    try:
        return wait_until(enough, timeout, f"{n} traced RPCs")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; traced:\n{tracing.rpc_stats(**filters)}") from None


@pytest.fixture(autouse=True)
def clean_traces():
    tracing.clear()
    yield
    tracing.enable(True, everywhere=False)
    tracing.clear()


def test_every_kind_of_call_is_traced_with_caller_callee_name_latency_bytes(world):
    world(2)
    assert tracing.rpc_stats().total() == 0, "nbdist's own start-up RPCs must not count"
    x = torch.ones(256)  # 1 KiB of tensor data
    for _ in range(10):
        rpc.rpc_sync("worker1", echo, args=(x,))
    futs = [rpc.rpc_async("worker2", echo, args=(x,)) for _ in range(5)]
    torch.futures.wait_all(futs)
    rpc.rpc_sync("worker1", torch.add, args=(x, 1))
    rref = rpc.remote("worker2", Counter)
    rref.rpc_sync().add(1)
    rref.rpc_async().add(2).wait()
    rref.remote().add(3).to_here()
    big = rpc.remote("worker1", zeros, args=(1000,))
    assert big.to_here().shape == (1000,)

    stats = _wait_total(10 + 5 + 1 + 1 + 3 + 1 + 1 + 1 + 1)  # the counts asserted below
    row = stats.get("worker0", "worker1", "echo")
    assert row is not None and row["count"] == 10, str(stats)
    assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["max_ms"] < 60_000
    assert row["bytes"] >= 10 * 1024, "payload bytes count the tensor"
    assert stats.get("worker0", "worker2", "echo")["count"] == 5
    assert stats.get("worker0", "worker1", "aten::add")["count"] == 1
    assert stats.get("worker0", "worker1", "aten::add")["bytes"] == 1024
    assert stats.get("worker0", "worker2", "Counter")["count"] == 1
    assert stats.get("worker0", "worker2", "Counter.add")["count"] == 3
    assert stats.get("worker0", "worker2", "_rref_typeof_on_owner")["count"] == 1
    to_here = stats.get("worker0", "worker1", "RRef.to_here")
    assert to_here["count"] == 1 and to_here["bytes"] == 4000
    assert stats.get("worker0", "worker2", "RRef.to_here")["count"] == 1
    assert stats.get("worker0", "worker1", "zeros")["count"] == 1

    text = str(stats)
    assert "Counter.add" in text and "p95_ms" in text
    assert "<table" in stats._repr_html_()
    assert list(stats.frame().columns) == list(tracing.RpcStats.COLUMNS)


def test_worker_calls_are_shipped_to_rank0(world):
    c = world(2)
    c.run("""
import torch, torch.distributed.rpc as rpc
def twice(x):
    return 2 * x
for _ in range(7):
    rpc.rpc_sync("worker2", twice, args=(torch.ones(3),))
""", ranks=[1], show=False)
    # rows of a %%dist cell arrive before its result: no waiting needed
    row = tracing.rpc_stats(caller="worker1").get("worker1", "worker2", "twice")
    assert row is not None and row["count"] == 7
    assert len(tracing.rpc_stats(callee="worker2")) == 1
    assert all(s[1] == "worker1" for s in tracing.samples())


def test_enable_false_stops_tracing_everywhere_and_true_resumes(world):
    c = world(2)
    tracing.enable(False)
    assert not tracing.enabled()
    rpc.rpc_sync("worker1", echo, args=(1,))
    rpc.remote("worker1", zeros, args=(2,)).to_here()
    c.run("import torch.distributed.rpc as rpc\nrpc.rpc_sync('worker2', abs, args=(-1,))\n",
          ranks=[1], show=False)
    assert c.flush(timeout=30)  # whatever the workers traced has arrived by now
    assert tracing.rpc_stats().total() == 0

    tracing.enable(True)
    rpc.rpc_sync("worker1", echo, args=(1,))
    c.run("rpc.rpc_sync('worker2', abs, args=(-1,))\n", ranks=[1], show=False)
    stats = _wait_total(2)
    assert stats.get("worker0", "worker1", "echo")["count"] == 1
    assert stats.get("worker1", "worker2", "abs")["count"] == 1


def test_disabled_setting_reaches_a_new_world(world):
    c = world(1)
    tracing.enable(False)
    c2 = c.restart(1, quiet=True)
    c2.run("import torch.distributed.rpc as rpc\nrpc.rpc_sync('worker0', abs, args=(-1,))\n",
           show=False)
    rpc.rpc_sync("worker1", echo, args=(1,))
    assert c2.flush(timeout=30)  # whatever the worker traced has arrived by now
    assert tracing.rpc_stats().total() == 0
    tracing.enable(True)


def test_paused_and_clear(world):
    world(1)
    with tracing.paused():
        rpc.rpc_sync("worker1", echo, args=(1,))
    rpc.rpc_sync("worker1", echo, args=(1,))
    assert _wait_total(1).total() == 1
    tracing.clear()
    assert tracing.rpc_stats().total() == 0 and tracing.samples() == []
    assert str(tracing.rpc_stats()) == "no RPCs traced yet"


def test_rpc_sync_imported_before_the_world_is_still_traced(world):
    world(1)
    plain = rpc.rpc_sync
    while hasattr(plain, "__wrapped__"):  # torch's own rpc_sync, as `from ... import` got it
        plain = plain.__wrapped__
    assert plain.__module__ == "torch.distributed.rpc.api"
    for _ in range(3):
        assert plain("worker1", echo, args=(5,)) == 5
    rpc.rpc_sync("worker1", echo, args=(5,))
    stats = _wait_total(4)
    assert stats.get("worker0", "worker1", "echo")["count"] == 4


SCRIPT_MODULE = '''
import torch


@torch.jit.script
def script_add(x: torch.Tensor, y: int) -> torch.Tensor:
    return x + y
'''


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")  # 2.15
def test_torchscript_functions_are_traced(world, tmp_path, monkeypatch):
    (tmp_path / "nbdist_scriptmod.py").write_text(SCRIPT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # workers take this process's sys.path
    from nbdist_scriptmod import script_add

    c = world(1)
    c.run("import nbdist_scriptmod", show=False)
    x = torch.ones(2)
    assert rpc.rpc_sync("worker1", script_add, args=(x, 3)).tolist() == [4.0, 4.0]
    assert rpc.rpc_async("worker1", script_add, args=(x, 3)).wait().tolist() == [4.0, 4.0]
    assert rpc.remote("worker1", script_add, args=(x, 3)).to_here().tolist() == [4.0, 4.0]
    row = _wait_total(4).get("worker0", "worker1", "__torch__.nbdist_scriptmod.script_add")
    assert row is not None and row["count"] == 3 and row["bytes"] == 3 * 8


def test_private_torch_names_tracing_wraps_are_still_there():
    """Tracing wraps these private torch names; a torch upgrade that moves them fails here."""
    import inspect

    from torch._C._distributed_rpc import PyRRef
    from torch.distributed.rpc import api, rref_proxy

    for name in ("_invoke_rpc_python_udf", "_invoke_rpc_builtin", "_invoke_rpc_torchscript",
                 "_invoke_remote_python_udf", "_invoke_remote_builtin",
                 "_invoke_remote_torchscript", "PythonUDF"):
        assert hasattr(api, name), name
        assert name in inspect.getsource(api._invoke_rpc) or name in inspect.getsource(
            api.remote), f"{name} is no longer looked up by rpc_sync/rpc_async/remote"
    assert callable(rref_proxy._local_invoke)
    assert callable(rref_proxy._local_invoke_async_execution)
    for method in ("to_here", "_get_type", "_get_future", "is_owner", "owner_name"):
        assert hasattr(PyRRef, method), method
