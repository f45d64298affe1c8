"""Equal lines of many ranks shown once, in a real world of 8 local workers (``aggregate``
is on by default there): what is shown, what the logs keep, the switch, and the delay of a
line nothing can merge with."""

from __future__ import annotations

import re
import statistics
import threading
import time

import pytest
import torch.distributed.rpc as rpc
from conftest import expand_ranks

import nbdist
from nbdist.output.router import AGGREGATE_WINDOW, Router
from nbdist.spec import WorldSpec

pytestmark = pytest.mark.slow
N = 8
LABEL = re.compile(r"^\[([^\]]+)\] (.*)$")


@pytest.fixture(scope="module")
def world():
    c = nbdist.start(N, quiet=True)
    try:
        c.run("print('up')", show=False)  # each rank's log file opens now, not in a test
        c.flush()
        yield c
    finally:
        c.stop()


@pytest.fixture
def shown(monkeypatch):
    """Every write of the router, as (monotonic time, stream, text)."""
    out: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def record(stream: str, text: str) -> None:
        with lock:
            out.append((time.monotonic(), stream, text))

    monkeypatch.setattr(Router, "write", staticmethod(record))
    return out


def _lines(shown: list) -> list[tuple[str, str]]:
    """(label, text) of every line shown."""
    result = []
    for _, _, text in shown:
        for line in text.splitlines():
            m = LABEL.match(line)
            if m:
                result.append((m.group(1), m.group(2)))
    return result


def _per_rank(lines: list[tuple[str, str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for label, text in lines:
        for r in expand_ranks(label):
            out.setdefault(r, []).append(text)
    return out


# every rank waits for the same moment, so that they print together even on a loaded machine
AT = "import os, time\nr = int(os.environ['NBDIST_RANK'])\ntime.sleep(max(0, {t} - time.time()))\n"


def test_aggregate_is_on_from_eight_workers(world):
    assert world.router.aggregate
    assert WorldSpec(N - 1).aggregates() is False
    assert WorldSpec(N).aggregates() is True


def test_equal_lines_show_once_with_the_ranks_and_the_logs_keep_every_line(world, shown):
    code = AT.format(t=time.time() + 1.0) + "print('epoch 3 done')\nprint('mine', r)\n"
    world.run(code, show=False)
    lines = _lines(shown)
    assert ("worker1-8", "epoch 3 done") in lines, lines
    assert sum(text == "epoch 3 done" for _, text in lines) == 1
    for r in range(1, N + 1):
        assert (f"worker{r}", f"mine {r}") in lines
        assert world.logs(r, tail=2) == ["epoch 3 done", f"mine {r}"]


def test_each_ranks_order_is_kept_and_no_line_is_lost(world, shown):
    code = AT.format(t=time.time() + 1.0) + (
        "print('start')\n"
        "for i in range(3):\n"
        "    print('step', i, 'of rank', r)\n"
        "    print('step', i, 'done')\n"
        "print('end', file=__import__('sys').stderr)\n")
    world.run(code, show=False)
    per = _per_rank(_lines(shown))
    for r in range(1, N + 1):
        assert per[r] == ["start", f"step 0 of rank {r}", "step 0 done", f"step 1 of rank {r}",
                          "step 1 done", f"step 2 of rank {r}", "step 2 done", "end"], r
    merged = [label for label, text in _lines(shown) if text == "step 2 done"]
    assert len(merged) < N  # some ranks' lines were merged ...
    assert any(t[1] == "stderr" and "] end" in t[2] for t in shown)  # ... on their stream


def test_the_switch_per_cell(world, shown):
    code = AT.format(t=time.time() + 0.5) + "print('same everywhere')\n"
    world.run(code, show=False, aggregate=False)
    lines = _lines(shown)
    assert sorted(label for label, text in lines if text == "same everywhere") == \
        sorted(f"worker{r}" for r in range(1, N + 1))
    assert world.router.aggregate  # the world's setting is back after the cell


def test_the_switch_for_the_world(world, shown):
    world.router.aggregate = False
    try:
        world.run(AT.format(t=time.time() + 0.5) + "print('hi')\n", show=False)
        assert len([1 for _, text in _lines(shown) if text == "hi"]) == N
    finally:
        world.router.aggregate = True


def test_a_line_printed_during_an_rpc_shows_before_the_call_returns(world, shown):
    def shout(i: int) -> int:
        print("inside", i)
        return i

    for r in (1, 5):
        assert rpc.rpc_sync(f"worker{r}", shout, args=(r,)) == r
        assert _lines(shown)[-1] == (f"worker{r}", f"inside {r}")  # no wait for the window


def test_a_line_nothing_merges_with_is_not_held_back_long(world, shown):
    """Outside a cell each rank prints its own line, and nothing it could merge with comes:
    each is shown one window (0.1 s) after it arrived, not at the next cell."""
    world.flush()

    def stamp(i: int) -> None:
        for k in range(5):
            print(f"stamped {i} {k} {time.monotonic()}")  # one clock: the same machine
            time.sleep(0.3)

    futs = [rpc.rpc_async(f"worker{r}", stamp, args=(r,)) for r in (2, 3)]
    for f in futs:
        f.wait()
    world.flush()
    delays = []
    for at, _, text in shown:
        for line in text.splitlines():
            m = re.search(r"stamped \d+ \d+ ([0-9.]+)$", line)
            if m:
                delays.append(at - float(m.group(1)))
    assert len(delays) >= 8  # the last of each rank may come with the flush
    assert statistics.median(delays) < AGGREGATE_WINDOW + 0.25, delays


def test_dist_magic_flag_turns_it_off_for_one_cell(world, shown):
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    ip.run_cell_magic("dist", "--aggregate off", AT.format(t=time.time() + 0.5) + "print('x')\n")
    assert len([1 for _, text in _lines(shown) if text == "x"]) == N
    ip.run_cell_magic("dist", "--aggregate on --ranks 1-3",
                      AT.format(t=time.time() + 0.5) + "print('y')\n")
    assert [label for label, text in _lines(shown) if text == "y"] == ["worker1-3"]
