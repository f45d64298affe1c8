"""Issue 19, item 1: worlds without torch RPC (``--no-rpc``, and torch builds without RPC).

Real worlds: a process group (gloo) and no RPC agent on any rank. Everything that travels on
nbdist's control channel works as in an RPC world; RPC calls raise ``NoRpcError`` naming
``--no-rpc``. Other behaviour is also checked in a no-RPC world by tests elsewhere,
parametrised over the world kind (output, status, rich output, metrics, debugging).
"""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist
import torch.distributed.rpc as rpc
from conftest import ev
from IPython.core.error import UsageError

import nbdist
import nbdist.parallel as todist
from nbdist.errors import NoRpcError
from nbdist.patches import no_rpc

SUM = ("import torch, torch.distributed as dist\n"
       "t = torch.tensor([float(dist.get_rank())])\n"
       "dist.all_reduce(t)\n"
       "t.item()")


def _pid() -> int:
    return os.getpid()


def test_cells_keep_state_and_a_local_cell_all_reduces_over_gloo(ipython, capsys):
    ipython.run_line_magic("dist_start", "2 --no-rpc --worker-name obs{rank}")
    start = capsys.readouterr().out
    assert "3 ranks ready" in start and "; no RPC (--no-rpc), process group gloo" in start
    c = nbdist.current()
    assert not c.rpc and not rpc._is_current_rpc_agent_set()  # no agent here ...
    assert c.run("import torch.distributed.rpc as rpc\nrpc._is_current_rpc_agent_set()",
                 show=False) == {1: "False", 2: "False"}  # ... nor on any worker
    assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 3

    ipython.run_cell_magic("dist", "", "x = 40\nprint('hello from', x)")
    ipython.run_cell_magic("dist", "--ranks obs2", "x += 2\nx")
    out = capsys.readouterr().out
    assert "[obs1] hello from 40" in out and "[obs2] hello from 40" in out
    assert "[obs2] 42" in out
    assert c.run("x", show=False) == {1: "40", 2: "42"}  # state lives across cells

    ipython.run_cell_magic("dist", "--local", SUM)
    out = capsys.readouterr().out
    assert "[obs1] 3.0" in out and "[obs2] 3.0" in out
    assert ipython.user_ns["t"].item() == 3.0  # rank 0 took part, here

    c.run("import nbdist, sys\nnbdist.log(seen=dist.get_rank())\n"
          "print('to stderr', file=sys.stderr)", show=False)
    c.flush()
    assert {r["rank"] for r in nbdist.history(key="seen")} == {1, 2}
    ipython.run_line_magic("dist_logs", "obs1 --tail 5")
    assert "[obs1] to stderr" in capsys.readouterr().out
    nbdist.clear_history()


def test_status_and_restarts_in_a_row_keep_the_world_without_rpc(ipython, capsys):
    ipython.run_line_magic("dist_start", "1 --no-rpc")
    for n in (3, 1, 2, 2, 4):
        ipython.run_line_magic("dist_restart", str(n))
        assert f"{n + 1} ranks ready" in capsys.readouterr().out
        c = nbdist.current()
        assert c.run("import torch.distributed as dist\ndist.get_world_size()",
                     show=False) == {r: str(n + 1) for r in range(1, n + 1)}
        ipython.run_cell_magic("dist", "--local", SUM)
        assert ipython.user_ns["t"].item() == sum(range(n + 1))
        table = ev(ipython, "get_ipython().run_line_magic('dist_status', '')")
        assert table.alive() == {r: True for r in range(n + 1)}
        assert not rpc._is_current_rpc_agent_set()
    capsys.readouterr()
    ipython.run_line_magic("dist_restart", "--rpc")  # RPC back, same size
    assert "; no RPC" not in capsys.readouterr().out
    c = nbdist.current()
    assert rpc.rpc_sync(c.names[4], _pid) == c.ranks[4].pid
    assert not dist.is_initialized()  # an RPC world has a group only when asked
    ipython.run_line_magic("dist_restart", "2 --no-rpc")  # and gone again
    with pytest.raises(NoRpcError, match="--no-rpc"):
        rpc.rpc_sync(nbdist.current().names[1], _pid)
    ipython.run_line_magic("dist_stop", "")
    assert no_rpc.active() is None


def test_rpc_calls_say_the_world_has_no_rpc_on_every_rank(world):
    from torch.distributed.rpc import rpc_async  # imported before the world started

    c = world(2, rpc=False)
    message = "needs torch RPC: this world was started with --no-rpc"
    with pytest.raises(NoRpcError, match="rpc_sync " + message):
        rpc.rpc_sync("worker1", _pid)
    with pytest.raises(NoRpcError, match="rpc_async " + message):
        rpc_async("worker1", _pid)
    with pytest.raises(NoRpcError, match="remote " + message):
        rpc.remote("worker1", _pid)
    with pytest.raises(NoRpcError, match="get_worker_info " + message):
        rpc.get_worker_info()
    with pytest.raises(NoRpcError, match="remote call of _pid " + message):
        todist.remote_sync_call(_pid, partitioner=1)
    with pytest.raises(NoRpcError, match="barrier " + message):
        todist.barrier()
    with pytest.raises(NoRpcError, match="auto_init_rpc"):
        todist.auto_init_rpc()(_pid)()
    with pytest.raises(NoRpcError, match="distributed autograd"):
        with todist.autograd.context():
            pass
    with pytest.raises(nbdist.DistCellError) as err:  # on the workers too
        c.run("import torch.distributed.rpc as rpc, os\nrpc.rpc_sync('worker0', os.getpid)",
              show=False)
    assert [f.etype for f in err.value.failures] == ["NoRpcError", "NoRpcError"]
    assert "start it without --no-rpc" in err.value.failures[0].message
    assert isinstance(NoRpcError("x"), RuntimeError)  # code catching torch's error still does
    c.stop()
    with pytest.raises(RuntimeError, match="RPC has not been initialized"):
        rpc.rpc_sync("worker1", _pid)  # no world: torch's own answer again


def test_a_torch_without_rpc_starts_worlds_without_it_and_says_so(world, monkeypatch, capsys):
    monkeypatch.setattr(rpc, "is_available", lambda: False)
    c = nbdist.start(1)
    try:
        out = capsys.readouterr().out
        assert "; no RPC (this torch has no torch.distributed.rpc), process group gloo" in out
        assert c.spec.rpc and not c.rpc  # asked for RPC, started without
        assert c.run("1 + 1", show=False) == {1: "2"}
        with pytest.raises(NoRpcError, match="this torch build has no torch.distributed.rpc"):
            rpc.rpc_sync("worker1", _pid)
    finally:
        c.stop()


def test_bad_input_is_refused_before_anything_starts(ipython):
    with pytest.raises(UsageError, match="--no-rpc"):
        ipython.run_line_magic("dist_start", "2 --no-rpc=yes")
    with pytest.raises(UsageError, match="--process-group nccl"):  # no CUDA, or one GPU
        ipython.run_line_magic("dist_start", "2 --no-rpc --process-group nccl")
    with pytest.raises(ValueError, match="rpc must be True or False"):
        nbdist.start(1, rpc="no")
    assert nbdist.current() is None


@pytest.mark.slow
def test_a_world_without_rpc_across_hosts():
    from fakehosts import FakeHosts, can_make_namespaces

    why = can_make_namespaces()
    if why is not None:
        pytest.skip(f"fake hosts: {why}")
    fh = FakeHosts(["a"])
    try:
        c = nbdist.start(1, hosts={fh.ns["a"]: 2}, iface=fh.address, launcher=fh.launcher,
                         rpc=False, quiet=True)
        try:
            exec_id = c.send_cell(SUM, [1, 2, 3])
            ns: dict = {}
            exec(SUM, ns)  # rank 0 takes part in the collective, as `%%dist --local` does
            results = c.report(c.collect(exec_id, [1, 2, 3], 60), [1, 2, 3], show=False)
            assert ns["t"].item() == 6.0 and set(results.values()) == {"6.0"}
            assert c.status().alive() == {0: True, 1: True, 2: True, 3: True}
            c = c.restart()
            assert c.run("import torch.distributed as dist\ndist.get_world_size()",
                         show=False) == {1: "4", 2: "4", 3: "4"}
        finally:
            c.stop()
    finally:
        nbdist.release_hosts()
        fh.close()
