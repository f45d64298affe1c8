"""The metrics stream: nbdist.log on every rank, thread and RPC handler reaches rank 0's history
complete and in order; history helpers export what was received."""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import WORLD_KINDS, wait_until

import nbdist
from nbdist.telemetry import records as metrics


@pytest.fixture(autouse=True)
def fresh_history():
    nbdist.clear_history()
    yield
    nbdist.clear_history()


def _log_burst(n: int, tag: str) -> int:
    """Runs on a worker, in an RPC handler thread."""
    import nbdist

    for i in range(n):
        nbdist.log(i=i, tag=tag)
    return n


@WORLD_KINDS
def test_four_ranks_5000_records_each_arrive_in_order(ipython, kind):
    ipython.run_line_magic("dist_start", f"4 {kind}")
    c = nbdist.current()
    ipython.run_cell_magic("dist", "", "import nbdist\nfor i in range(5000):\n"
                                       "    nbdist.log(i=i, reward=i * 0.5)\n")
    # "it hangs" deadline; how fast records arrive is measured in bench/rpc/metrics.py
    rows = wait_until(lambda: (len(h := nbdist.history()) >= 20000) and h, 60,
                      "20,000 records from the cell")
    assert len(rows) == 20000
    for r in range(1, 5):
        mine = [x for x in rows if x["rank"] == r]
        assert [x["i"] for x in mine] == list(range(5000)), f"rank {r} out of order or lossy"
        assert [x["step"] for x in mine] == list(range(5000))
        assert {x["name"] for x in mine} == {c.names[r]}
        times = [x["time"] for x in mine]
        assert times == sorted(times) and abs(times[-1] - time.time()) < 60
        assert mine[10]["reward"] == 5.0


def test_threads_and_rpc_handlers_lose_nothing_under_load(world):
    c = world(2)
    c.run("""
import threading, nbdist
def spam(t):
    for i in range(3000):
        nbdist.log(step=i, thread=t, i=i)
threads = [threading.Thread(target=spam, args=(t,)) for t in range(4)]
for th in threads: th.start()
for th in threads: th.join()
""", show=False)
    futs = [rpc.rpc_async(c.names[r], _log_burst, args=(2000, "rpc")) for r in (1, 2)]
    assert [f.wait() for f in futs] == [2000, 2000]
    rows = wait_until(lambda: (len(h := nbdist.history()) >= 2 * (4 * 3000 + 2000)) and h,
                      60, "every record from threads and RPC handlers")
    assert len(rows) == 2 * (4 * 3000 + 2000)
    for r in (1, 2):
        for t in range(4):
            seq = [x["i"] for x in rows if x["rank"] == r and x.get("thread") == t]
            assert seq == list(range(3000)), (r, t)
        seq = [x["i"] for x in rows if x["rank"] == r and x.get("tag") == "rpc"]
        assert seq == list(range(2000))


def test_log_in_rpc_handler_then_restart_at_once_and_log_again(world):
    c = world(2)
    for r in (1, 2):
        rpc.rpc_sync(c.names[r], _log_burst, args=(1500, "before"))
    c2 = c.restart(2, quiet=True)  # no wait: the last batches are still on their way
    before = nbdist.history(key="tag")
    assert len([x for x in before if x["tag"] == "before"]) == 3000
    c2.run("import nbdist\nfor i in range(100):\n    nbdist.log(i=i, tag='after')\n",
           show=False)
    after = [x for x in nbdist.history(key="tag") if x["tag"] == "after"]
    assert len(after) == 200
    for r in (1, 2):
        assert [x["step"] for x in after if x["rank"] == r] == list(range(100))


def test_rank0_log_and_subscribers(world):
    got = []
    metrics.subscribe(got.extend)
    try:
        world(1)
        nbdist.log(loss=torch.tensor(0.25), step=7)
        nbdist.log(loss=0.5)
        rows = nbdist.history(rank=0)
        assert [(r["step"], r["loss"]) for r in rows] == [(7, 0.25), (8, 0.5)]
        assert isinstance(rows[0]["loss"], float) and rows[0]["name"] == "worker0"
        assert [r["loss"] for r in got] == [0.25, 0.5]
    finally:
        metrics.unsubscribe(got.extend)


def test_log_rejects_nothing_and_reserved_names():
    with pytest.raises(ValueError, match="at least one named value"):
        nbdist.log()
    with pytest.raises(ValueError, match="reserved"):
        nbdist.log(rank=3)
    with pytest.raises(ValueError, match="reserved"):
        nbdist.log(time=3.0)
    assert nbdist.history() == []


def test_internal_records_never_reach_history():
    seen = []
    metrics.register_internal("test-kind", seen.append)
    metrics.deliver([{"rank": 1, "name": "w1", "step": 0, "time": 0.0, "x": 1},
                      {metrics.INTERNAL: "test-kind", "payload": 5}])
    assert [r["x"] for r in nbdist.history()] == [1]
    assert seen == [{metrics.INTERNAL: "test-kind", "payload": 5}]


def test_history_filters_clear_and_exports(tmp_path):
    metrics.deliver([{"rank": 1, "name": "w1", "step": 0, "time": 1.0, "reward": 1.5},
                      {"rank": 2, "name": "w2", "step": 0, "time": 2.0, "loss": 0.1},
                      {"rank": 1, "name": "w1", "step": 1, "time": 3.0, "reward": 2.5}])
    assert [r["reward"] for r in nbdist.history(rank=1)] == [1.5, 2.5]
    assert [r["rank"] for r in nbdist.history(key="loss")] == [2]
    nbdist.history()[0]["reward"] = 99  # copies: the history itself is untouched
    assert nbdist.history()[0]["reward"] == 1.5

    j = nbdist.export_history(str(tmp_path / "h.json"))
    assert json.load(open(j)) == nbdist.history()
    c = nbdist.export_history(str(tmp_path / "h.csv"))
    rows = list(csv.DictReader(open(c)))
    assert list(rows[0]) == ["rank", "name", "step", "time", "reward", "loss"]
    assert [r["reward"] for r in rows] == ["1.5", "", "2.5"]
    with pytest.raises(ValueError, match=".csv or .json"):
        nbdist.export_history(str(tmp_path / "h.txt"))

    frame = nbdist.history_frame()
    assert list(frame["rank"]) == [1, 2, 1] and frame.shape[0] == 3

    gen = metrics.generation()
    nbdist.clear_history()
    assert nbdist.history() == [] and metrics.generation() == gen + 1
    nbdist.log(x=1)
    assert nbdist.history()[0]["step"] == 0


def test_follow_is_atomic_with_delivery():
    metrics.deliver([{"rank": 1, "name": "w1", "step": 0, "time": 1.0, "v": 0}])
    later = []
    rows, gen = metrics.follow(later.extend)
    try:
        metrics.deliver([{"rank": 1, "name": "w1", "step": 1, "time": 1.0, "v": 1}])
        assert [r["v"] for r in rows] == [0] and [r["v"] for r in later] == [1]
        assert gen == metrics.generation()
    finally:
        metrics.unsubscribe(later.extend)
