"""Bounded resources, nothing lost: values that cannot cross arrive as their repr, a worker's
queue of records is bounded without dropping any, rank 0's tracing buffer folds, and a
million records cost the notebook well under 100 MB."""

from __future__ import annotations

import gc
import threading

import psutil
import pytest
import torch.distributed.rpc as rpc
from conftest import wait_until

import nbdist
from nbdist.telemetry import records, tracing


@pytest.fixture(autouse=True)
def fresh_history():
    nbdist.clear_history()
    yield
    nbdist.clear_history()


def _echo(x):
    return x


CANNOT_CROSS = """
import threading, nbdist
class OnlyHere:
    def __repr__(self):
        return "<OnlyHere on this worker>"
nbdist.log(step=0, lock=threading.Lock())
nbdist.log(step=1, thing=OnlyHere())
nbdist.log(step=2, numbers=[1.5, 2.5], shape=(2, 3))
nbdist.log(step=3, reward=1.0)
"""


def test_values_that_cannot_cross_arrive_as_their_repr(world):
    c = world(2)
    c.run(CANNOT_CROSS, show=False)  # records travel before the cell's result
    for r in (1, 2):
        rows = {x["step"]: x for x in nbdist.history(rank=r)}
        assert sorted(rows) == [0, 1, 2, 3], rows
        assert isinstance(rows[0]["lock"], str) and "lock" in rows[0]["lock"]
        assert rows[1]["thing"] == "<OnlyHere on this worker>"
        assert rows[2]["numbers"] == [1.5, 2.5] and rows[2]["shape"] == (2, 3)
        assert rows[3]["reward"] == 1.0
    assert c.run("1+1", show=False) == {1: "2", 2: "2"}
    # the flusher and the receiver are still alive: a record logged in the background arrives
    c.run("import threading, nbdist\n"
          "threading.Thread(target=lambda: nbdist.log(step=9, late=True)).start()", show=False)
    wait_until(lambda: len(nbdist.history(key="late")) == 2, 5.0, "records logged afterwards")


def test_rank0_keeps_values_as_they_are():
    lock = threading.Lock()
    nbdist.log(lock=lock, flag=True, n=3, x=0.5)
    (row,) = nbdist.history()
    assert row["lock"] is lock and row["flag"] is True and row["n"] == 3 and row["x"] == 0.5
    assert type(row["n"]) is int and type(row["flag"]) is bool


LOG_FAST = """
import threading, time, nbdist
from nbdist.telemetry import outbox, records
records.MAX_PENDING = 2000
_peak = [0]
_stop = threading.Event()
def _watch():
    while not _stop.is_set():
        _peak[0] = max(_peak[0], outbox.pending_count())
        time.sleep(0.0005)
_w = threading.Thread(target=_watch)
_w.start()
for i in range(60000):
    nbdist.log(step=i, i=i)
_stop.set()
_w.join()
_peak[0]
"""


def test_a_worker_queue_is_bounded_and_loses_nothing(world):
    c = world(1)
    peak = int(c.run(LOG_FAST, show=False)[1])
    assert 1000 < peak <= 2000, f"the worker held at most {peak} records (bound 2000)"
    rows = nbdist.history(rank=1)
    assert [x["i"] for x in rows] == list(range(60000))


def test_rank0_tracing_buffer_folds_into_the_aggregates(world, monkeypatch):
    c = world(1)
    tracing.clear()
    monkeypatch.setattr(tracing, "FOLD_AT", 100)
    for i in range(400):
        rpc.rpc_sync(c.names[1], _echo, args=(i,))
        assert len(tracing._CALLS_PER_PROCESS.done) <= 101
    assert tracing.total_calls() == 400
    tracing.clear()


LOG_MILLION = """
import random, nbdist
for i in range({n}):
    nbdist.log(step=i, reward=random.random())
"""


@pytest.mark.timeout(600)
def test_a_million_records_from_four_ranks_cost_under_100_mb(world):
    c = world(4)
    gc.collect()
    before = psutil.Process().memory_info().rss
    c.run(LOG_MILLION.format(n=250_000), show=False)
    assert records.record_count() == 1_000_000
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    assert grown <= 100e6, f"1M records grew the notebook by {grown / 1e6:.0f} MB"
    rows = nbdist.history(rank=3, key="reward")
    assert [x["step"] for x in rows[:5]] == [0, 1, 2, 3, 4] and len(rows) == 250_000
    assert all(0.0 <= x["reward"] < 1.0 for x in rows)
