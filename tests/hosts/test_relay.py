"""Issue 52: the notebook's cost grows with hosts, not ranks. A cell, a view's call, push or
pull, an interrupt, a flush and a stop reach a host's ranks in one frame to its join agent
(``hosts.rank_pipes``), which batches a cell's or call's answers back; a local rank keeps its own
path. Counted by ``c.frames`` on a bed of 4 fake hosts x 4 ranks (network namespaces,
tests/fakehosts.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import wait_until
from fakehosts import FakeHosts, can_make_namespaces

import nbdist
from nbdist.errors import DistCallError, DistCellError, DistTimeoutError

WHY = can_make_namespaces()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=f"fake hosts: {WHY}")]

HOSTS, PER_HOST = 4, 4
REMOTE = list(range(2, 2 + HOSTS * PER_HOST))  # rank 1 is local


def _pids_in(fh: FakeHosts, host: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", fh.ns[host]], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _rank() -> int:
    return int(os.environ["NBDIST_RANK"])


def _tensor(n: int):
    return torch.full((n,), float(_rank()))


def _odd_fails() -> int:
    if _rank() % 2:
        raise ValueError(f"odd {_rank()}")
    return _rank()


def _fails_alike() -> None:
    raise ValueError("the same on every rank, in C:\\new")  # torch unescapes the text


@rpc.functions.async_execution
def _later(n: int):
    fut = torch.futures.Future()
    fut.set_result(n + _rank())
    return fut


def _naps(n: int) -> int:
    for _ in range(n):
        time.sleep(0.05)
    return n


class _Box:
    def __init__(self, value: int) -> None:
        self.value = value

    def get(self) -> int:
        return self.value


def _open(rref) -> int:
    return rref.rpc_sync().get()


@contextlib.contextmanager
def _ctrl_c_after(seconds: float):
    """SIGINT to this process's main thread ``seconds`` into the block (the ``ctrl_c`` fixture
    makes it a KeyboardInterrupt)."""
    main = threading.main_thread().ident
    timer = threading.Timer(seconds, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _replies(c) -> int:
    """``Relayed`` frames the notebook has had from the agents so far."""
    return sum(a.relayed_frames for a in c._world.agents.values())


@pytest.fixture(scope="module")
def bed():
    fh = FakeHosts([f"r{i}" for i in range(HOSTS)])
    try:
        c = nbdist.start(1, hosts={fh.ns[h]: PER_HOST for h in fh.names}, iface=fh.address,
                         launcher=fh.launcher, quiet=True, start_timeout=240)
        try:
            c.run("rank = 0\nprint('up')", show=False)  # each rank's log file opens now
            c.flush()
            yield fh, c
        finally:
            nbdist.stop()
    finally:
        nbdist.release_hosts()
        fh.close()


def test_a_cell_is_one_frame_per_host_and_its_answers_are_batched(bed, capsys):
    fh, c = bed
    before = _replies(c)
    out = c.run("import os\nrank = int(os.environ['NBDIST_RANK'])\nprint('alike')\n"
                "print('hello from', rank)\nrank * 10", show=False)
    sent = c.frames.last_cell
    assert (sent.frames, sent.relayed) == (HOSTS + 1, HOSTS)  # 4 agents + the local rank
    assert list(out) == [1, *REMOTE]  # every rank, in rank order
    assert out == {r: str(r * 10) for r in [1, *REMOTE]}
    replies = _replies(c) - before
    assert HOSTS <= replies < len(REMOTE), f"{replies} frames answered 16 ranks"
    c.flush()
    text = capsys.readouterr().out
    for r in [1, *REMOTE]:
        assert f"hello from {r}" in text
    assert "alike" in text


def test_errors_come_back_per_rank_with_their_tracebacks(bed):
    fh, c = bed
    odd = [r for r in REMOTE if r % 2]
    with pytest.raises(DistCellError) as info:
        c.run("if rank % 2:\n    raise ValueError(f'bad {rank}')\nrank", ranks=REMOTE,
              show=False)
    failed = {f.rank: f for f in info.value.failures}
    assert sorted(failed) == odd
    for r in odd:
        assert failed[r].etype == "ValueError" and failed[r].message == f"bad {r}"
        assert "raise ValueError" in failed[r].traceback
    assert c.frames.last_cell.frames == HOSTS


def test_a_long_cells_output_shows_while_it_runs(bed, capsys):
    fh, c = bed
    capsys.readouterr()
    exec_id = c.send_cell("import time\nprint('early', rank)\ntime.sleep(4)\n'late'", REMOTE)
    seen = ""

    def shown() -> bool:
        nonlocal seen
        seen += capsys.readouterr().out
        return all(f"early {r}" in seen for r in REMOTE)

    t0 = time.monotonic()
    wait_until(shown, 3.5, "every remote rank's first line while its cell still runs")
    assert time.monotonic() - t0 < 3.5
    results = c.collect(exec_id, REMOTE, timeout=60)
    assert {r: res.value for r, res in results.items()} == {r: "'late'" for r in REMOTE}


def test_an_interrupt_is_one_frame_per_host(bed):
    fh, c = bed
    before = c.frames.message("interrupt").frames
    with pytest.raises(DistTimeoutError):
        c.run("import time\ntime.sleep(60)", ranks=REMOTE, timeout=2.0, show=False)
    assert c.frames.message("interrupt").frames - before == HOSTS
    # had the interrupt not reached every rank, they would sleep on for a minute
    assert c.run("'ok'", ranks=REMOTE, timeout=30, show=False) == {r: "'ok'" for r in REMOTE}


def test_a_view_call_is_one_frame_per_host_with_real_values(bed):
    fh, c = bed
    before, answers = c.frames.message("call"), _replies(c)
    assert c[:].call(_rank) == {r: r for r in [1, *REMOTE]}  # rank 1: an RPC, as ever
    sent = c.frames.message("call")
    assert (sent.frames - before.frames, sent.relayed - before.relayed) == (HOSTS, HOSTS)
    # the answers come back as they went: a host's wait for each other (up to HOLD)
    assert HOSTS <= _replies(c) - answers < len(REMOTE), _replies(c) - answers
    got = c[REMOTE].call(_tensor, 3)
    assert list(got) == REMOTE
    for r in REMOTE:
        assert torch.equal(got[r], torch.full((3,), float(r)))


def test_push_pull_scatter_gather_across_hosts(bed):
    fh, c = bed
    before = c.frames.message("call").frames
    c[REMOTE].push({"v": 5, "w": "x"})
    assert c[REMOTE].pull(["v", "w"]) == {r: (5, "x") for r in REMOTE}
    assert c.frames.message("call").frames - before == 2 * HOSTS
    c[REMOTE].scatter("rows", list(range(32)))  # a share per rank: an RPC to each
    assert c[REMOTE].gather("rows") == list(range(32))


def test_a_view_call_holding_an_rref_goes_as_an_rpc_to_each_rank(bed):
    fh, c = bed
    box = rpc.remote(c.names[1], _Box, args=(7,))  # an RRef pickles only inside an RPC
    before = c.frames.message("call").frames
    assert c[REMOTE[:4]].call(_open, box) == {r: 7 for r in REMOTE[:4]}
    assert c.frames.message("call").frames == before


def test_a_view_calls_errors_name_each_rank(bed):
    fh, c = bed
    odd = [r for r in REMOTE if r % 2]
    with pytest.raises(DistCallError) as info:
        c[REMOTE].call(_odd_fails)
    failed = {f.rank: f for f in info.value.failures}
    assert sorted(failed) == odd
    for r in odd:
        assert failed[r].etype == "ValueError" and failed[r].message == f"odd {r}"
        assert "_odd_fails" in failed[r].traceback
    assert info.value.results == {r: r for r in REMOTE if r not in odd}


def test_a_relayed_call_fails_as_the_same_call_over_rpc(bed):
    """Rank 1 is local: torch's RPC carries the call; rank 2's agent relays it and the rank
    runs it as its RPC server would. What each raised reads the same."""
    fh, c = bed
    with pytest.raises(DistCallError) as info:
        c[[1, 2]].call(_fails_alike)
    over_rpc, relayed = sorted(info.value.failures, key=lambda f: f.rank)
    assert (over_rpc.rank, relayed.rank) == (1, 2)
    assert over_rpc.shape() == relayed.shape(), (over_rpc, relayed)
    assert relayed.etype == "ValueError" and "_fails_alike" in relayed.traceback


def test_an_async_execution_function_through_the_relay(bed):
    fh, c = bed
    assert c[:].call(_later, 100) == {r: 100 + r for r in [1, *REMOTE]}


def test_a_view_call_past_its_timeout_is_interrupted_on_every_rank(bed):
    fh, c = bed
    view = c[REMOTE]
    view.timeout = 2.0
    t0 = time.monotonic()
    with pytest.raises(DistCallError) as info:
        view.call(_naps, 600)  # 30 s, had the interrupt not reached them
    assert sorted(f.rank for f in info.value.failures) == REMOTE
    assert {f.etype for f in info.value.failures} == {"DistTimeoutError"}
    assert c[REMOTE].call(_rank) == {r: r for r in REMOTE}
    assert time.monotonic() - t0 < 25


def test_without_the_relay_each_rank_is_sent_to(bed, monkeypatch):
    fh, c = bed
    monkeypatch.setenv("NBDIST_RELAY", "0")
    assert c.run("rank", show=False) == {r: str(r) for r in [1, *REMOTE]}
    assert (c.frames.last_cell.frames, c.frames.last_cell.relayed) == (1 + len(REMOTE), 0)
    before = c.frames.message("call").frames
    assert c[REMOTE].call(_rank) == {r: r for r in REMOTE}  # an RPC to each
    assert c.frames.message("call").frames == before


def test_stop_is_one_frame_per_host_and_leaves_only_the_agents(bed):
    fh, c = bed
    before = c.frames.message("stop").frames
    c.stop()
    assert c.frames.message("stop").frames - before == HOSTS + 1
    for h in fh.names:  # the agent alone is left, for the next world
        wait_until(lambda h=h: len(_pids_in(fh, h)) == 1, 10.0,
                   f"host {h} to hold its agent alone after stop")
    nbdist.release_hosts()
    for h in fh.names:
        wait_until(lambda h=h: not _pids_in(fh, h), 10.0, f"host {h} to be empty")


def test_ctrl_c_during_a_relayed_view_call_interrupts_every_rank_by_a_frame_per_host(bed,
                                                                                      ctrl_c):
    """In a world of its own (after the bed's stop): the interrupts that chase an RPC run in
    a thread the world owns until it stops."""
    fh, _ = bed
    c = nbdist.start(0, hosts={fh.ns[h]: 2 for h in fh.names}, iface=fh.address,
                     launcher=fh.launcher, quiet=True, start_timeout=240)
    try:
        ranks = list(range(1, 1 + 2 * HOSTS))
        c.run("print('up')", show=False)
        before = c.frames.message("interrupt")
        t0 = time.monotonic()
        with _ctrl_c_after(1.5), pytest.raises(KeyboardInterrupt):
            c[:].call(_naps, 600)  # 30 s, had the interrupt not reached them
        assert time.monotonic() - t0 < 10
        sent = c.frames.message("interrupt")
        # the rank waited on is told first, then the others at once: a frame per host, not
        # per rank (the interrupts that chase an RPC not yet begun go to each rank, as ever)
        assert HOSTS <= sent.relayed - before.relayed <= HOSTS + 1
        assert c[:].call(_rank) == {r: r for r in ranks}  # none still asleep
    finally:
        c.stop()
        nbdist.release_hosts()  # the agents this world started with it
