"""nbdist.parallel: TorchOpt's distributed API, checked against single-process results.

Unit tests need no world. The world tests use a real 3-rank world (this process + 2 workers)
and functions defined the way a notebook cell defines them (in a module called ``__main__``),
so they only work if those functions travel by value.
"""

from __future__ import annotations

import itertools
import linecache
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, free_port, wait_until
from torch import nn

import nbdist
import nbdist.parallel as todist
from nbdist.parallel import sync as barrier_module
from nbdist.parallel.partition import Partition, split_sizes
from nbdist.parallel.reduce import PartitionResults

_cells = itertools.count(1)


def cell(src: str) -> SimpleNamespace:
    """Define things as a notebook cell does: in a namespace whose ``__name__`` is __main__."""
    code = textwrap.dedent(src)
    filename = f"<notebook-cell-{next(_cells)}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)  # as IPython
    ns: dict = {"__name__": "__main__"}
    exec(compile(code, filename, "exec"), ns)
    return SimpleNamespace(**ns)


def grads_of(loss: torch.Tensor, model: nn.Module) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(loss, tuple(model.parameters()))


def close(a, b, atol: float = 1e-6) -> bool:
    return all(torch.allclose(x, y, atol=atol) for x, y in zip(a, b, strict=True))


def test_private_torch_names_we_rely_on():
    """World info asks the running RPC agent through these; a torch upgrade must not hide it."""
    from torch.distributed.rpc import api, constants

    assert callable(api._is_current_rpc_agent_set) and callable(api._get_current_rpc_agent)
    assert constants.UNSET_RPC_TIMEOUT == todist.UNSET_RPC_TIMEOUT
    assert not api._is_current_rpc_agent_set() and todist.get_world_size() >= 1


# ---------------------------------------------------------------- no world: partitioners


@pytest.fixture
def env_world(monkeypatch):
    """No RPC world; the torchrun variables say 3 ranks (read at call time, not import)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_split_sizes():
    assert split_sizes(6, 3) == [2, 2, 2]
    assert split_sizes(7, 3) == [3, 2, 2]
    assert split_sizes(2, 2) == [1, 1]


def test_batch_partitioner_uneven_split_keeps_sizes(env_world):
    x = torch.arange(14.0).reshape(7, 2)
    parts = todist.batch_partitioner(x, torch.arange(7), scale=2.0, extra={"y": torch.ones(7)})
    assert [p.rank for p in parts] == [0, 1, 2]
    assert [p.size for p in parts] == [3, 2, 2]
    assert torch.equal(torch.cat([p.args[0] for p in parts]), x)
    assert all(p.kwargs["scale"] == 2.0 for p in parts)  # non-tensors go to every partition
    assert [p.kwargs["extra"]["y"].shape[0] for p in parts] == [3, 2, 2]
    rank, args, kwargs = parts[1]  # still a TorchOpt triple
    assert rank == 1 and len(args) == 2 and "scale" in kwargs
    # fewer samples than ranks: one sample each, on the first ranks
    assert [(p.rank, p.size) for p in todist.batch_partitioner(torch.ones(2, 5))] == [(0, 1),
                                                                                    (1, 1)]
    # nothing to split: one call, here
    assert [(p.rank, p.size) for p in todist.batch_partitioner(3, k="v")] == [(0, None)]


def test_dim_partitioner_exclusive_and_dims(env_world):
    tasks = torch.randn(5, 4, 2)
    parts = todist.dim_partitioner(0, exclusive=True, keepdim=False)(tasks)
    assert [p.rank for p in parts] == [0, 1, 2, 0, 1]  # round robin over the ranks
    assert all(p.args[0].shape == (4, 2) and p.size == 1 for p in parts)
    assert torch.equal(parts[3].args[0], tasks[3])
    kept = todist.dim_partitioner(0, exclusive=True)(tasks)
    assert all(p.args[0].shape == (1, 4, 2) for p in kept)
    last = todist.dim_partitioner(-1, workers=["worker2", 0])(torch.randn(3, 5))
    assert [(p.rank, p.args[0].shape[-1]) for p in last] == [(2, 3), (0, 2)]
    with pytest.raises(ValueError, match="exclusive=True"):
        todist.dim_partitioner(0, keepdim=False)
    with pytest.raises(ValueError, match="batch size mismatch"):
        todist.batch_partitioner(torch.ones(4), torch.ones(5))
    with pytest.raises(ValueError, match="no worker named 'nobody'"):
        todist.dim_partitioner(0, workers=["nobody"])(torch.ones(4))


def test_partitioners_pickle(env_world):
    made = [todist.batch_partitioner, todist.exclusive_batch_partitioner,
            todist.dim_partitioner(1, exclusive=True, keepdim=False, workers=[1, "worker2"])]
    for p in made:
        q = pickle.loads(pickle.dumps(p))
        assert q == p and q is not p
        x = torch.randn(4, 4)
        assert [(a.rank, a.size) for a in q(x)] == [(b.rank, b.size) for b in p(x)]
    part = pickle.loads(pickle.dumps(Partition(2, (torch.ones(3),), {"k": 1}, 3)))
    assert part.size == 3 and part.rank == 2 and part.kwargs == {"k": 1}
    res = pickle.loads(pickle.dumps(PartitionResults([1.0, 2.0], [3, 1], [0, 1])))
    assert res == [1.0, 2.0] and res.sizes == [3, 1] and res.ranks == [0, 1]


# ---------------------------------------------------------------- no world: reducers


def test_mean_reducer_weights_uneven_partitions():
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    chunks = [x[:3], x[3:5], x[5:]]
    means = PartitionResults([c.mean(0) for c in chunks], sizes=[3, 2, 2])
    # float32 sums in another order: equal to rounding (a mean near 0 has no relative slack)
    assert torch.allclose(todist.mean_reducer(means), x.mean(0), atol=1e-6)
    # what TorchOpt computes (unweighted) is not the batch mean: the test above can fail
    assert not torch.allclose(torch.stack(list(means)).mean(0), x.mean(0))
    # a plain list (no sizes) is averaged equally, as in TorchOpt
    assert torch.allclose(todist.mean_reducer([torch.tensor(1.0), torch.tensor(3.0)]),
                          torch.tensor(2.0))
    pairs = PartitionResults([(torch.tensor(1.0), 10.0), (torch.tensor(4.0), 40.0)], [1, 2])
    loss, acc = todist.mean_reducer(pairs)
    assert torch.allclose(loss, torch.tensor(3.0)) and acc == pytest.approx(30.0)
    assert torch.equal(todist.sum_reducer([torch.ones(2), 2 * torch.ones(2)]), 3 * torch.ones(2))
    assert todist.sum_reducer([1, 2, 3]) == 6
    with pytest.raises(ValueError):
        todist.mean_reducer([])


# ---------------------------------------------------------------- no world: world info, ranks


def test_world_info_reads_environment_at_call_time(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    info = todist.get_world_info()
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (1, 4, 1, 2)
    assert info.worker_name == "worker1" and info.worker_id == 1
    only_zero = todist.rank_zero_only(lambda: "zero")
    not_zero = todist.rank_non_zero_only(lambda: "other")
    assert only_zero() is None and not_zero() == "other"
    monkeypatch.setenv("RANK", "0")  # decorated before the change: still decided per call
    assert todist.get_rank() == 0 and only_zero() == "zero" and not_zero() is None
    with pytest.raises(ValueError, match="no rank 7"):
        todist.get_worker_id(7)


def test_barrier_without_world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    todist.barrier()  # a world of one: nothing to wait for
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(todist.BarrierError, match="no RPC world"):
        todist.barrier()


# ---------------------------------------------------------------- no world: module_clone


def test_module_clone_modes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ref = todist.module_clone(model, by="reference")
    assert ref is not model
    assert all(a is b for a, b in zip(ref.parameters(), model.parameters(), strict=True))
    copy = todist.module_clone(model, by="copy")
    for p, q in zip(model.parameters(), copy.parameters(), strict=True):
        assert not isinstance(q, nn.Parameter) and "CloneBackward" in type(q.grad_fn).__name__
        assert torch.equal(p, q)
    x = torch.randn(4, 3)
    assert close(grads_of(copy(x).sum(), model), grads_of(model(x).sum(), model))
    deep = todist.module_clone(model, by="deepcopy")
    for p, q in zip(model.parameters(), deep.parameters(), strict=True):
        assert isinstance(q, nn.Parameter) and q.grad_fn is None and q is not p
        assert torch.equal(p, q)
    buf = todist.module_clone(model, by="ref", detach_buffers=True)
    assert buf[1].running_mean is not model[1].running_mean
    assert torch.equal(buf[1].running_mean, model[1].running_mean)
    moved = todist.module_clone(model, by="copy", device="cpu")
    assert all(q.device.type == "cpu" and q.grad_fn is not None for q in moved.parameters())
    tree = todist.module_clone({"w": model[0].weight, "n": 3}, by="clone")
    assert tree["n"] == 3 and tree["w"].grad_fn is not None
    with pytest.raises(ValueError, match="by must be one of"):
        todist.module_clone(model, by="shallow")


# ---------------------------------------------------------------- real world

CELL = """
import torch
import nbdist.parallel as todist

def loss_fn(model, x, y):
    return ((model(x) - y) ** 2).mean()

def whoami(x):
    info = todist.get_world_info()
    return info.world_rank, info.worker_name, info.world_size, x.shape[0]

@todist.rank_zero_only
def zero_only():
    return "zero"

@todist.rank_non_zero_only
def non_zero():
    return todist.get_rank()

@todist.on_rank(2)
def on_two():
    return "two"

@todist.not_on_rank(1)
def not_one():
    return "not one"

def gates(_):
    return zero_only(), non_zero(), on_two(), not_one()
"""


def test_world_info_and_rank_gates_live(world):
    c = world(2)
    nb = cell(CELL)
    assert nb.loss_fn.__module__ == "__main__"  # must travel by value
    info = todist.get_world_info()
    assert tuple(info) == (0, 3, 0, 3, "worker0") and todist.get_world_size() == 3
    assert todist.get_worker_id("worker2") == 2 and todist.get_worker_id() == 0
    ranks = todist.remote_sync_call(nb.whoami, args=(torch.ones(7),))
    assert [r[:3] for r in ranks] == [(r, c.names[r], 3) for r in range(3)]
    assert [r[3] for r in ranks] == [3, 2, 2]
    assert nb.gates(None) == ("zero", None, None, "not one")
    gated = todist.remote_sync_call(nb.gates, args=(torch.ones(3),))
    assert gated == [("zero", None, None, "not one"), (None, 1, None, None),
                     (None, 2, "two", "not one")]


@pytest.mark.parametrize("batch", [6, 7])
def test_data_parallel_equals_single_process(world, batch):
    world(2)
    nb = cell(CELL)
    torch.manual_seed(batch)
    model = nn.Linear(4, 1)
    x, y = torch.randn(batch, 4), torch.randn(batch, 1)
    ref_loss = nb.loss_fn(model, x, y)
    ref_grads = grads_of(ref_loss, model)

    with todist.autograd.context() as ctx:
        chunks = todist.remote_sync_call(nb.loss_fn, args=(todist.module_clone(model, by="copy"),
                                                           x, y),
                                         partitioner=todist.batch_partitioner)
        assert chunks.sizes == split_sizes(batch, 3) and chunks.ranks == [0, 1, 2]
        loss = todist.mean_reducer(chunks)
        grads = todist.autograd.grad(ctx, loss, tuple(model.parameters()))
        kept = todist.autograd.get_gradients(ctx)
        assert close([kept[p] for p in model.parameters()], ref_grads)
    assert torch.allclose(loss, ref_loss) and close(grads, ref_grads)
    if batch % 3:  # uneven: an unweighted mean of the chunk losses is a different number
        assert not torch.allclose(torch.stack(list(chunks)).mean(), ref_loss)

    dp_loss = todist.parallelize(partitioner=todist.batch_partitioner,
                                 reducer=todist.mean_reducer)(nb.loss_fn)
    model.zero_grad()
    with todist.autograd.context() as ctx:
        loss = dp_loss(todist.module_clone(model, by="clone"), x, y)
        todist.autograd.backward(ctx, loss)
    assert torch.allclose(loss, ref_loss)
    assert close([p.grad for p in model.parameters()], ref_grads)
    fut = todist.parallelize_async()(nb.loss_fn)(model, x, y)  # defaults: batch + mean
    assert torch.allclose(fut.wait(), ref_loss.detach())


MAML = """
import torch
import nbdist.parallel as todist
from torch.func import functional_call

def inner_loop(model, task, steps=2, lr=0.1):
    x, y = task[:, :3], task[:, 3:]
    inner = todist.module_clone(model, by="reference", detach_buffers=True)
    params = dict(inner.named_parameters())
    for _ in range(steps):
        loss = ((functional_call(inner, params, (x,)) - y) ** 2).mean()
        g = torch.autograd.grad(loss, tuple(params.values()), create_graph=True)
        params = {k: p - lr * gi for (k, p), gi in zip(params.items(), g)}
    return ((functional_call(inner, params, (x,)) - y) ** 2).mean()

def nested(model, tasks, partitioner):
    # on a worker: a received partitioner, used for a further remote call
    return todist.remote_sync_call(inner_loop, args=(model, tasks), partitioner=partitioner,
                                   reducer=todist.mean_reducer)
"""


def test_maml_exclusive_dim_partitioner_and_autograd(world):
    world(2)
    nb = cell(MAML)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    tasks = torch.randn(5, 4, 4)  # 5 tasks of 4 samples
    ref = torch.stack([nb.inner_loop(model, t) for t in tasks]).mean()
    ref_grads = grads_of(ref, model)  # second order: through the inner updates

    per_task = todist.dim_partitioner(0, exclusive=True, keepdim=False)
    maml = todist.parallelize(partitioner=per_task, reducer=todist.mean_reducer)(nb.inner_loop)
    with todist.autograd.context() as ctx:
        loss = maml(todist.module_clone(model, by="copy"), tasks)
        grads = todist.autograd.grad(ctx, loss, tuple(model.parameters()))
    assert torch.allclose(loss, ref) and close(grads, ref_grads)

    model.zero_grad()
    with todist.autograd.context() as ctx:  # two backward passes add the gradient twice
        loss = maml(todist.module_clone(model, by="copy"), tasks)
        todist.autograd.backward(ctx, loss, retain_graph=True)
        todist.autograd.backward(ctx, loss, inputs=list(model.parameters()))
    assert close([p.grad for p in model.parameters()], [2 * g for g in ref_grads])

    # the partitioner travels to worker 1, which fans the tasks out again
    with todist.autograd.context() as ctx:
        loss = todist.remote_sync_call(nb.nested, args=(todist.module_clone(model, by="copy"),
                                                        tasks, per_task), partitioner=1)[0]
        grads = todist.autograd.grad(ctx, loss, tuple(model.parameters()))
    assert torch.allclose(loss, ref) and close(grads, ref_grads)


FAIL = """
import torch
import nbdist.parallel as todist

class ShardError(Exception):
    pass

def picky(x):
    if todist.get_rank() == 2:
        raise ShardError(f"rank {todist.get_rank()} refuses {x.shape[0]} rows")
    return x.sum()

def total(x):
    return x.sum()

def slow(seconds):
    import time
    time.sleep(seconds)
"""


def test_failing_partition_names_rank_worker_and_error(world):
    world(2)
    nb = cell(FAIL)
    x = torch.ones(6)
    with pytest.raises(todist.PartitionError) as err:
        todist.remote_sync_call(nb.picky, args=(x,), reducer=todist.sum_reducer)
    e = err.value
    assert (e.rank, e.worker_name, e.etype) == (2, "worker2", "ShardError")
    assert e.message == "rank 2 refuses 2 rows" and len(e.failures) == 1
    assert "rank 2 (worker2)" in str(e) and "ShardError: rank 2 refuses 2 rows" in str(e)
    assert "picky" in str(e) and "raise ShardError" in e.failures[0].traceback
    assert type(e.__cause__).__name__ == "ShardError"
    assert isinstance(e, nbdist.RemoteError)
    again = pickle.loads(pickle.dumps(e))  # survives a trip back from a nested call
    assert str(again) == str(e) and again.failures[0].traceback == e.failures[0].traceback
    with pytest.raises(todist.PartitionError, match=r"rank 2 \(worker2\)"):
        todist.remote_async_call(nb.picky, args=(x,)).wait()
    assert todist.remote_sync_call(nb.picky, args=(x,), partitioner="worker1") == [6.0]
    with pytest.raises(todist.PartitionError) as err:  # the reply never comes: RPC timeout
        todist.remote_sync_call(nb.slow, args=(1.5,), partitioner=2, timeout=0.3)
    assert (err.value.rank, err.value.worker_name) == (2, "worker2")
    assert "timeout" in err.value.message.lower()


def test_custom_partitioner_triples(world):
    world(2)
    nb = cell(FAIL)

    def halves(x):  # TorchOpt's contract: plain (rank, args, kwargs) triples, no sizes
        return [(1, (x[:4],), None), ("worker2", (x[4:],), {})]

    x = torch.arange(6.0)
    out = todist.remote_sync_call(nb.total, args=(x,), partitioner=halves)
    assert out == [6.0, 9.0] and out.ranks == [1, 2] and out.sizes == [None, None]
    mean = todist.remote_sync_call(nb.total, args=(x,), partitioner=halves,
                                   reducer=todist.mean_reducer)
    assert mean.item() == pytest.approx(7.5)  # sizes unknown: an equal-weight mean


def test_barrier_waits_for_all_and_raises_on_missing(world):
    c = world(2)
    with pytest.raises(todist.BarrierError) as err:  # the workers never arrive
        todist.barrier(timeout=0.5)
    assert err.value.missing == ["worker1", "worker2"]
    assert "never arrived: worker1, worker2" in str(err.value)

    code = "import nbdist.parallel as todist\ntodist.barrier()\n'passed'"
    exec_id = c.send_cell(code, [1, 2])
    todist.barrier(timeout=60)
    assert c.report(c.collect(exec_id, [1, 2], 60), [1, 2], show=False) == {1: "'passed'",
                                                                           2: "'passed'"}
    # a follower whose leader (worker1) never comes
    with pytest.raises(nbdist.DistCellError, match="never arrived: worker1"):
        c.run("import nbdist.parallel as todist\n"
              "todist.barrier(['worker1', 2], timeout=0.5)", ranks=[2], show=False)
    # the leader (this notebook) gives up: worker1, already waiting, fails at once with why
    exec_id = c.send_cell("todist.barrier(timeout=60)", [1])
    waiting = barrier_module._state()
    # the leader must give up while worker1 waits, not before it came
    wait_until(lambda: "worker1" in waiting.get(tuple(c.names), {}), 60,
               "worker1 waiting at the notebook's barrier")
    with pytest.raises(todist.BarrierError, match="never arrived: worker2"):
        todist.barrier(timeout=1.5)
    with pytest.raises(nbdist.DistCellError, match="timed out after 1.5s; never arrived: worker2"):
        c.report(c.collect(exec_id, [1], 30), [1], show=False)
    exec_id = c.send_cell("todist.barrier([0, 'worker1'])\n'again'", [1])  # still usable
    todist.barrier(["worker1", "worker0"], timeout=60)
    assert c.report(c.collect(exec_id, [1], 60), [1], show=False) == {1: "'again'"}


INIT = """
import os
import torch
import nbdist.parallel as todist

def worker_init_fn():
    torch.manual_seed(100 + todist.get_rank())
    os.environ["NBDIST_TEST_INIT"] = str(todist.get_rank())

def probe(x):
    return os.environ.get("NBDIST_TEST_INIT"), todist.get_world_size()

@todist.auto_init_rpc(worker_init_fn)
def main(x):
    return todist.remote_sync_call(probe, args=(x,))
"""


def test_auto_init_rpc_in_a_running_world(world):
    world(2)
    nb = cell(INIT)
    try:
        assert nb.main(torch.ones(3)) == [("0", 3), ("1", 3), ("2", 3)]
    finally:
        os.environ.pop("NBDIST_TEST_INIT", None)
    assert nbdist.current() is not None and todist.get_world_size() == 3  # nothing restarted


SCRIPT = """
import json
import os
import torch
import nbdist.parallel as todist

def worker_init_fn():
    os.environ["INIT_RANK"] = str(todist.get_rank())

def chunk_mean(x):
    return x.mean()

def init_rank(x):
    return os.environ.get("INIT_RANK")

@todist.rank_zero_only
def train():
    x = torch.arange(7.0)
    loss = todist.remote_sync_call(chunk_mean, args=(x,), reducer=todist.mean_reducer)
    seen = todist.remote_sync_call(init_rank, args=(x,))
    return {"loss": loss.item(), "mean": x.mean().item(), "inits": seen}

@todist.auto_init_rpc(worker_init_fn)
def main():
    info = todist.get_world_info()
    return {"info": list(info), "train": train()}

if __name__ == "__main__":
    out = main()
    from torch.distributed.rpc import api
    out["rpc_left_up"] = api._is_current_rpc_agent_set()
    print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_auto_init_rpc_under_torchrun_environment(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   TP_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    import json

    results = [json.loads(o.split("RESULT ", 1)[1]) for o in outs]
    zero, one = results
    assert zero["info"] == [0, 2, 0, 2, "worker0"] and one["info"] == [1, 2, 1, 2, "worker1"]
    assert zero["train"]["loss"] == pytest.approx(zero["train"]["mean"])
    assert zero["train"]["inits"] == ["0", "1"] and one["train"] is None
    assert not zero["rpc_left_up"] and not one["rpc_left_up"]
