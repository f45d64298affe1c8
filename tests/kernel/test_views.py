"""Issue 36: worker ranks addressed as one (``c[:]``, ``c[1:3]``, ``c[[1, 3]]``, ``c["obs2"]``).

Real worlds and real RPC: values of each kind go to the ranks and come back as real objects,
a raising rank is reported with its traceback after the others answered, a rank that dies
mid-call is named within a bound, Ctrl-C interrupts the call on every rank. The code the ranks
run is compiled into a ``__main__`` namespace here, so it travels by value as a notebook
cell's does.
"""

from __future__ import annotations

import linecache
import signal
import threading
import time

import pytest
import torch
from conftest import wait_until

import nbdist
from nbdist.cluster.views import join, select, split
from nbdist.errors import DistCallError, NoRpcError

_CELL = '''
import os
import time

import torch.distributed.rpc as rpc


class Box:
    """A class defined in a notebook cell."""

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other).__name__ == "Box" and other.value == self.value


class CellError(Exception):
    pass


def rank():
    return rpc.get_worker_info().id


def echo(value):
    return value, rank()


def fail_on(bad):
    if rank() == bad:
        raise CellError(f"rank {bad} fails on purpose")
    return rank() * 10


def die_on(bad):
    if rank() == bad:
        time.sleep(0.2)
        os._exit(7)
    time.sleep(0.5)
    return rank()


def nap(seconds, marker):
    for _ in range(int(seconds * 100)):
        time.sleep(0.01)
    with open(f"{marker}.{rank()}", "w") as f:
        f.write("finished")
'''
# as IPython keeps a cell's source, so that tracebacks show its lines
linecache.cache["<notebook-cell-views>"] = (len(_CELL), None, _CELL.splitlines(True),
                                            "<notebook-cell-views>")
_ns: dict = {"__name__": "__main__"}
exec(compile(_CELL, "<notebook-cell-views>", "exec"), _ns)
Box, CellError = _ns["Box"], _ns["CellError"]
rank, echo, fail_on, die_on, nap = (_ns[k] for k in ("rank", "echo", "fail_on", "die_on",
                                                      "nap"))


# -- picking ranks, splitting, joining: no world needed ---------------------------------------
def test_views_select_workers_as_ipyparallel_indexes_engines():
    names = ["agent", "obs1", "obs2", "obs3", "obs4"]
    assert select(slice(None), names) == [1, 2, 3, 4]  # c[:]: every worker, not the notebook
    assert select(slice(1, 3), names) == [1, 2]
    assert select(slice(-2, None), names) == [3, 4]
    assert select(slice(None, None, 2), names) == [2, 4]
    assert select([1, 3], names) == [1, 3]
    assert select("obs2", names) == [2]
    assert select(4, names) == [4]
    with pytest.raises(ValueError, match="rank 0 is the notebook"):
        select(slice(0, 2), names)
    with pytest.raises(ValueError, match="no rank 5"):
        select(5, names)
    with pytest.raises(ValueError, match="selects no worker"):
        select(slice(7, 9), names)


def test_split_is_contiguous_longer_shares_first_and_join_undoes_it():
    assert split(list(range(10)), 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split([1], 3) == [[1], [], []]
    t = torch.arange(10.0)
    parts = split(t, 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert parts[1].untyped_storage().nbytes() == 3 * 4  # a copy, not a view of all of t
    assert torch.equal(join(parts), t)
    assert join([[1, 2], [3]]) == [1, 2, 3]


# -- calls -------------------------------------------------------------------------------------
def test_values_of_each_kind_travel_both_ways_as_real_objects(world):
    c = world(3)
    big = torch.randn(1024, 1024)  # 4 MB: the shared-memory path between local ranks
    values = {"small": torch.tensor([1.0, 2.0]), "big": big, "box": Box([1, 2]),
              "none": None, "error": ValueError("a value, not raised")}
    for label, value in values.items():
        got = c[:].call(echo, value)
        assert sorted(got) == [1, 2, 3], label
        for r, (back, where) in got.items():
            assert where == r, label
            if isinstance(value, torch.Tensor):
                assert torch.equal(back, value), label
            elif isinstance(value, Exception):
                assert type(back) is ValueError and str(back) == str(value)
            else:
                assert back == value, label
    # made on the ranks: a notebook class, a large tensor and an exception come back
    made = c[1:3].call(lambda n: (Box(n), torch.full((600_000,), float(n)), KeyError(n)), 7)
    assert sorted(made) == [1, 2]
    box, tensor, err = made[2]
    assert box == Box(7) and tensor.shape == (600_000,) and float(tensor[-1]) == 7.0
    assert isinstance(err, KeyError)
    assert c["worker2"].call(rank) == {2: 2}
    assert c[[1, 3]].call(rank) == {1: 1, 3: 3}


def test_call_async_map_and_choose(world, tmp_path):
    c = world(3)
    fut = c[:].call_async(echo, "x")
    assert fut.result() == {r: ("x", r) for r in (1, 2, 3)}
    assert fut.done() and fut.result() == fut.wait()
    assert c[:].map(lambda x: x * x, range(7)) == [x * x for x in range(7)]
    assert c[:].map(lambda x: x, []) == []
    assert c[1:3].map(lambda x: (x, rank()), "abc") == [("a", 1), ("b", 1), ("c", 2)]
    chosen = [c[:].choose(rank) for _ in range(6)]
    assert sorted(set(chosen)) == [1, 2, 3]  # idle ranks take turns
    busy = c[2].call_async(nap, 1.0, str(tmp_path / "nap"))
    assert c[[2, 3]].choose(rank) == 3  # rank 2 has a call in flight, rank 3 none
    assert busy.result() == {2: None}
    late = c[1:3]
    late.timeout = 0.5
    t0 = time.monotonic()
    with pytest.raises(DistCallError) as info:
        late.call(nap, 5.0, str(tmp_path / "late"))
    assert time.monotonic() - t0 < 4.0
    assert [(f.rank, f.etype) for f in info.value.failures] == [(1, "DistTimeoutError"),
                                                                (2, "DistTimeoutError")]
    assert "no answer within 0.5 s" in str(info.value)
    time.sleep(5.0)  # past the end of the nap, had it not been interrupted
    assert not list(tmp_path.glob("late.*")), "a rank ran on past its view's timeout"


def test_a_raising_rank_is_named_with_its_traceback_after_the_others_answered(world):
    c = world(3)
    with pytest.raises(DistCallError) as info:
        c[:].call(fail_on, 2)
    err = info.value
    assert err.results == {1: 10, 3: 30}
    (failure,) = err.failures
    assert (failure.rank, failure.name, failure.etype) == (2, "worker2", "CellError")
    assert failure.message == "rank 2 fails on purpose"
    assert "<notebook-cell-views>" in failure.traceback and "raise CellError" in \
        failure.traceback
    assert "rank 2 (worker2)" in str(err)
    rendered = "\n".join(err._render_traceback_())
    assert "--- rank 2 (worker2) ---" in rendered and "raise CellError" in rendered
    assert c[:].call(rank) == {1: 1, 2: 2, 3: 3}  # the world goes on


def test_push_pull_scatter_gather_reach_the_namespace_cells_run_in(world):
    c = world(3)
    v = c[:]
    v.push({"lr": 0.5, "weights": torch.ones(3)})
    assert v.pull("lr") == {1: 0.5, 2: 0.5, 3: 0.5}
    assert c.run("lr * 2", show=False) == {1: "1.0", 2: "1.0", 3: "1.0"}  # a %%dist cell
    assert all(torch.equal(w, torch.ones(3)) for w in v.pull("weights").values())
    assert v.pull(["lr", "weights"])[2][0] == 0.5
    c[2]["lr"] = Box(3)
    assert v["lr"] == {1: 0.5, 2: Box(3), 3: 0.5}
    v.scatter("part", list(range(10)))
    assert v.pull("part") == {1: [0, 1, 2, 3], 2: [4, 5, 6], 3: [7, 8, 9]}
    assert v.gather("part") == list(range(10))
    data = torch.randn(1_000_000)  # shares of ~1.3 MB each
    v.scatter("x", data)
    assert torch.equal(v.gather("x"), data)
    assert c.run("len(x)", show=False) == {1: "333334", 2: "333333", 3: "333333"}
    c.run("y = rank_of_cell = 5", show=False)
    assert v.pull("y") == {1: 5, 2: 5, 3: 5}  # what a %%dist cell bound
    with pytest.raises(DistCallError) as info:
        c[1:3].pull("nowhere")
    assert [f.etype for f in info.value.failures] == ["NameError", "NameError"]
    assert "'nowhere' is not defined" in info.value.failures[0].message
    with pytest.raises(ValueError, match="names of variables"):
        v.push({"not a name": 1})
    with pytest.raises(TypeError, match="variable name"):
        v[1]


# -- faults ------------------------------------------------------------------------------------
def test_a_rank_dying_mid_call_is_named_within_a_bound_and_the_rest_answer(world):
    c = world(3)
    t0 = time.monotonic()
    with pytest.raises(DistCallError) as info:
        c[:].call(die_on, 2)
    assert time.monotonic() - t0 < 15.0
    err = info.value
    assert err.results == {1: 1, 3: 3}
    (failure,) = err.failures
    assert (failure.rank, failure.etype) == (2, "WorkerDiedError")
    assert failure.message == "exited with code 7"
    assert "rank 2 (worker2)" in str(err)
    t0 = time.monotonic()  # a call that names the dead rank again fails at once
    with pytest.raises(DistCallError) as again:
        c[:].call(rank)
    assert time.monotonic() - t0 < 5.0
    assert again.value.results == {1: 1, 3: 3}
    assert [f.rank for f in again.value.failures] == [2]


def test_ctrl_c_during_call_interrupts_every_rank(world, ctrl_c, tmp_path):
    c = world(3)
    marker = tmp_path / "done"
    timer = threading.Timer(0.8, lambda: signal.pthread_kill(threading.main_thread().ident,
                                                             signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            c[:].call(nap, 20.0, str(marker))
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 5.0
    active = "import nbdist.patches.rpc_hooks as h\nlen(h._ACTIVE_PER_PROCESS)"
    wait_until(lambda: c.run(active, show=False) == {1: "0", 2: "0", 3: "0"}, 10.0,
               "every rank's RPC function to end after Ctrl-C")
    assert not list(tmp_path.iterdir()), "a rank ran its call to the end after Ctrl-C"
    assert c[:].call(rank) == {1: 1, 2: 2, 3: 3}


def test_a_world_without_rpc_refuses_views_with_a_clear_error(world):
    c = world(1, rpc=False)
    with pytest.raises(NoRpcError, match="--no-rpc"):
        c[:].call(rank)


def test_views_follow_a_full_restart(world):
    c = world(2)
    v = c[:]
    c.restart(3, quiet=True)
    assert v.call(rank) == {1: 1, 2: 2}  # the view's ranks, in the new world
    assert c[:].call(rank) == {1: 1, 2: 2, 3: 3}
    c.stop()
    with pytest.raises(nbdist.ClusterStateError):
        v.call(rank)


# -- magics ------------------------------------------------------------------------------------
def test_dist_push_and_dist_pull_magics(ipython):
    from IPython.core.error import UsageError

    ipython.run_line_magic("dist_start", "3")
    ipython.user_ns.update(alpha=3, beta=torch.arange(2))
    ipython.run_line_magic("dist_push", "alpha beta --ranks 1-2")
    assert ipython.run_line_magic("dist_pull", "alpha --ranks 1-2") == {1: 3, 2: 3}
    pulled = ipython.run_line_magic("dist_pull", "beta --ranks 1-2")
    assert all(torch.equal(pulled[r], torch.arange(2)) for r in (1, 2))
    assert ipython.run_line_magic("dist_pull", "alpha beta --ranks 1")[1][0] == 3
    with pytest.raises(DistCallError, match="rank 3"):  # never pushed there
        ipython.run_line_magic("dist_pull", "alpha")
    with pytest.raises(UsageError, match="gamma"):
        ipython.run_line_magic("dist_push", "gamma")
    with pytest.raises(UsageError, match="no rank 9"):
        ipython.run_line_magic("dist_push", "alpha --ranks 9")


# -- in a real kernel, as a notebook user meets it ----------------------------------------------
_KERNEL_CELL = '''
import os, time
import torch.distributed.rpc as rpc

def nap(seconds, marker):
    for _ in range(int(seconds * 100)):
        time.sleep(0.01)
    open(f"{marker}.{rpc.get_worker_info().id}", "w").close()

def picky():
    if rpc.get_worker_info().id == 2:
        raise ValueError("rank 2 says no")
    return "fine"
'''


def test_in_a_kernel_ctrl_c_ends_a_call_and_a_failure_shows_the_cell_line(kernel, tmp_path):
    rep = kernel.execute("%load_ext nbdist\n%dist_start 2\nimport nbdist\nc = nbdist.current()",
                         timeout=120)
    assert rep.status == "ok", rep
    assert kernel.execute(_KERNEL_CELL).status == "ok"
    msg = kernel.send(f"c[:].call(nap, 30, {str(tmp_path / 'done')!r})")
    time.sleep(1.5)
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    rep = kernel.collect(msg, timeout=20)
    assert rep.status == "error" and rep.error["ename"] == "KeyboardInterrupt", rep
    assert time.monotonic() - t0 < 10
    assert kernel.value("c[:].call(len, 'ab')", timeout=20) == {1: 2, 2: 2}
    active = "import nbdist.patches.rpc_hooks as h; len(h._ACTIVE_PER_PROCESS)"
    wait_until(lambda: kernel.value(f"c.run({active!r}, show=False)") == {1: "0", 2: "0"},
               10.0, "every rank's RPC function to end after Ctrl-C")
    assert not list(tmp_path.iterdir()), "a rank ran its call to the end after Ctrl-C"
    rep = kernel.execute("c[:].call(picky)")
    assert rep.status == "error" and rep.error["ename"] == "DistCallError", rep
    shown = "\n".join(rep.error["traceback"])
    assert "--- rank 2 (worker2) ---" in shown and 'raise ValueError("rank 2 says no")' in shown
    assert kernel.execute("%dist_stop").status == "ok"
