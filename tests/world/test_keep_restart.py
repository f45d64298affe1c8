"""Issue 18: a world that heals and grows. ``%dist_restart --keep`` keeps the live workers'
processes and ``__main__``; dead ranks come back empty under their number; N grows and
shrinks the world; ``--heal`` does it on its own and gives up on a crash loop. Real worlds,
real SIGKILLs."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import psutil
import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import wait_until

import nbdist
from nbdist.cluster import restart
from nbdist.errors import ClusterStateError, DistCellError, WorkerDiedError

MARK = "import os\nmarker = ('set before', os.getpid())"
READ = "marker if 'marker' in globals() else None"


def _markers(c) -> dict[int, str | None]:
    return c.run(READ, show=False)


def _pid_marker(c, r: int) -> str:
    return repr(("set before", c.ranks[r].pid))


def slow_echo(x, seconds):
    time.sleep(seconds)
    return x


def test_sigkill_mid_rpc_then_keep_brings_it_back_and_the_others_keep_their_state(world,
                                                                                  capsys):
    c = world(4)
    c.run(MARK, show=False)
    before = {r: c.ranks[r].pid for r in range(1, 5)}
    threading.Timer(0.5, os.kill, args=(before[2], signal.SIGKILL)).start()
    with pytest.raises(WorkerDiedError) as info:  # mid-RPC
        rpc.rpc_sync("worker2", slow_echo, args=(1, 30))
    assert "rank 2" in str(info.value)
    capsys.readouterr()

    same = c.restart(keep=True)
    line = capsys.readouterr().out
    assert same is c and c.running
    assert "kept state: 1, 3, 4" in line and "fresh: 2 (killed by SIGKILL" in line, line
    assert {r: c.ranks[r].pid for r in (1, 3, 4)} == {r: before[r] for r in (1, 3, 4)}
    assert c.ranks[2].pid != before[2]
    assert _markers(c) == {1: _pid_marker(c, 1), 2: None, 3: _pid_marker(c, 3),
                           4: _pid_marker(c, 4)}
    # RPC, RRefs and distributed autograd work in the rebuilt world, to old and new ranks
    assert rpc.rpc_sync("worker2", os.getpid) == c.ranks[2].pid
    assert rpc.rpc_sync("worker3", os.getpid) == before[3]
    rref = rpc.remote("worker1", torch.add, args=(torch.ones(3), 0))
    assert rref.to_here().tolist() == [1.0, 1.0, 1.0]
    import torch.distributed.autograd as dist_autograd

    with dist_autograd.context() as ctx:
        w = torch.ones(2, requires_grad=True)
        loss = rpc.rpc_sync("worker4", torch.mul, args=(w, 3.0)).sum()
        dist_autograd.backward(ctx, [loss])
        assert dist_autograd.get_gradients(ctx)[w].tolist() == [3.0, 3.0]
    # a kept worker's own RPCs reach the new process of rank 2
    out = c.run("import torch.distributed.rpc as rpc, os\n"
                "rpc.rpc_sync('worker2', os.getpid)", ranks=[3], show=False)
    assert out == {3: str(c.ranks[2].pid)}


def test_grow_two_to_four_then_shrink_to_three_keeping_state(world, capsys):
    c = world(2)
    c.run(MARK, show=False)
    c.run("import nbdist\nnbdist.log(step=0, before=1)", show=False)
    first = {r: c.ranks[r].pid for r in (1, 2)}
    c.restart(4, keep=True)
    assert "fresh: 3 (new), 4 (new)" in capsys.readouterr().out
    assert c.world_size == 5 and c.names == ["worker0", *(f"worker{r}" for r in range(1, 5))]
    assert _markers(c) == {1: _pid_marker(c, 1), 2: _pid_marker(c, 2), 3: None, 4: None}
    assert {r: c.ranks[r].pid for r in (1, 2)} == first
    c.run(MARK, ranks=[3, 4], show=False)
    c.run("import nbdist\nnbdist.log(step=1, before=2)", show=False)
    c.flush()
    kept = sorted((h["rank"], h["before"]) for h in nbdist.history(key="before"))
    assert kept == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 2), (4, 2)]  # old records stay
    gone = c.ranks[4].pid
    c.restart(3, keep=True)
    line = capsys.readouterr().out
    assert "kept state: 1, 2, 3" in line and "stopped: 4" in line, line
    assert c.world_size == 4 and 4 not in c.ranks
    assert _markers(c) == {r: _pid_marker(c, r) for r in (1, 2, 3)}
    wait_until(lambda: not psutil.pid_exists(gone) or
               psutil.Process(gone).status() == psutil.STATUS_ZOMBIE, 5.0, "rank 4 to end")
    names = sorted(w.name for w in rpc._get_current_rpc_agent().get_worker_infos())
    assert names == ["worker0", "worker1", "worker2", "worker3"]


def test_the_process_group_is_rebuilt_with_the_new_membership(world):
    c = world(2, process_group="gloo")
    c.run("import torch.distributed as dist\nfirst_group = dist.group.WORLD", show=False)
    c.restart(3, keep=True)
    code = ("import torch\nimport torch.distributed as dist\nt = torch.ones(1)\n"
            "dist.all_reduce(t)\n(int(t.item()), dist.get_world_size(), "
            "'first_group' in globals())")
    exec_id = c.send_cell(code, [1, 2, 3])
    import torch.distributed as dist

    mine = torch.ones(1)
    dist.all_reduce(mine)  # rank 0 is in the group too, as in `%%dist --local`
    got = c.report(c.collect(exec_id, [1, 2, 3], 60), [1, 2, 3], show=False)
    assert mine.item() == 4
    assert got == {1: "(4, 4, True)", 2: "(4, 4, True)", 3: "(4, 4, False)"}


def test_heal_replaces_a_killed_rank_and_keeps_the_others(world, capsys):
    c = world(3, heal=True)
    c.run(MARK, show=False)
    old = c.ranks[2].pid
    t0 = time.monotonic()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: c.ranks[2].pid != old and c.ranks[2].ready and c.running, 20.0,
               "rank 2 to be replaced by --heal")
    took = time.monotonic() - t0
    assert c.startup_seconds < 2.0, c.startup_seconds  # the rebuild itself
    assert took < 10.0, took  # the whole heal, on a loaded 2-core machine
    assert _markers(c) == {1: _pid_marker(c, 1), 2: None, 3: _pid_marker(c, 3)}
    assert rpc.rpc_sync("worker2", os.getpid) == c.ranks[2].pid
    assert c.healer is not None and c.healer.healed == 1
    assert any(e["kind"] == "heal" and "fresh: 2" in e["text"] for e in nbdist.events())


def test_heal_gives_up_on_a_rank_that_keeps_dying(world):
    c = world(2, heal=True)
    c.healer.limit = 2  # two deaths in the window: the second is not healed
    first = c.ranks[1].pid
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: c.ranks[1].pid != first and c.ranks[1].ready and c.running, 20.0,
               "rank 1 to be replaced once")
    second = c.ranks[1].pid
    os.kill(second, signal.SIGKILL)
    wait_until(lambda: c.healer.gave_up == 1, 10.0, "healing to stop")
    time.sleep(0.5)
    assert not c.ranks[1].alive and c.healer.healed == 1
    with pytest.raises(WorkerDiedError):
        c.run("1", ranks=[1], show=False)
    assert c.run("1", ranks=[2], show=False) == {2: "1"}  # the rest still serves cells
    c.restart(keep=True, quiet=True)  # the user's way on
    assert c.ranks[1].alive and c.run("1", show=False) == {1: "1", 2: "1"}


def test_a_cell_running_when_heal_rebuilds_reports_the_dead_rank_without_hanging(world):
    c = world(3, heal=True)
    doomed = c.ranks[2].pid
    threading.Timer(0.5, os.kill, args=(doomed, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(DistCellError) as info:
        c.run("import time\ntime.sleep(2)\n'done'", show=False, timeout=60)
    assert time.monotonic() - t0 < 30
    assert [f.rank for f in info.value.failures] == [2]
    wait_until(lambda: c.ranks[2].alive and c.running, 20.0, "rank 2 to be healed")
    assert c.run("'after'", show=False) == {1: "'after'", 2: "'after'", 3: "'after'"}


def test_keep_without_a_running_world_starts_fresh_and_says_so(world, capsys):
    c = world(1)
    c.stop()
    c2 = restart(keep=True)
    try:
        assert "no rank has state to keep" in capsys.readouterr().out
        assert c2.running and c2 is not c
    finally:
        c2.stop()


def test_keep_refuses_to_move_a_world_to_other_machines(world):
    c = world(1)
    with pytest.raises(ValueError, match="--keep cannot change hosts"):
        c.restart(keep=True, hosts="nodeA:1", iface="lo")
    assert c.running


def test_keep_restart_magic_and_heal_flag(ipython, capsys):
    ipython.run_line_magic("dist_start", "2")
    ipython.run_cell("%%dist\nmarker = 41")
    ipython.run_line_magic("dist_restart", "3 --keep --heal")
    out = capsys.readouterr().out
    assert "kept state: 1, 2" in out and "fresh: 3 (new)" in out, out
    c = nbdist.current()
    assert c.spec.heal and c.healer is not None
    assert c.run("globals().get('marker')", show=False) == {1: "41", 2: "41", 3: None}
    ipython.run_line_magic("dist_restart", "--keep --no-heal")
    assert not nbdist.current().spec.heal and nbdist.current().healer is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_twenty_keep_restarts_leak_no_threads_fds_or_memory(world):
    c = world(2)
    c.run("import numpy\nkept = list(range(1000))", show=False)
    proc = psutil.Process()

    def sample():
        gc.collect()
        workers = [psutil.Process(c.ranks[r].pid) for r in (1, 2)]
        return {"threads": threading.active_count(), "os_threads": proc.num_threads(),
                "fds": proc.num_fds(), "rss": proc.memory_info().rss,
                "worker_threads": [w.num_threads() for w in workers],
                "worker_fds": [w.num_fds() for w in workers],
                "worker_rss": [w.memory_info().rss for w in workers]}

    for _ in range(3):  # torch's lazily made pools and caches settle first
        c.restart(keep=True, quiet=True)
    base = sample()
    for _ in range(20):
        c.restart(keep=True, quiet=True)
        assert c.run("len(kept)", show=False) == {1: "1000", 2: "1000"}
    after = sample()
    assert after["threads"] <= base["threads"] + 1, (base, after)
    assert after["os_threads"] <= base["os_threads"] + 4, (base, after)
    assert after["fds"] <= base["fds"] + 4, (base, after)
    for b, a in zip(base["worker_threads"], after["worker_threads"], strict=True):
        assert a <= b + 4, (base, after)
    for b, a in zip(base["worker_fds"], after["worker_fds"], strict=True):
        assert a <= b + 4, (base, after)
    # the stated bound (README): under 40 MB of growth per process over 20 keep-restarts
    assert after["rss"] - base["rss"] < 40 << 20, (base, after)
    for b, a in zip(base["worker_rss"], after["worker_rss"], strict=True):
        assert a - b < 40 << 20, (base, after)


def test_stop_during_heal_leaves_nothing_running(world):
    c = world(2, heal=True)
    os.kill(c.ranks[1].pid, signal.SIGKILL)
    c.stop()  # whether the heal already began or not: no hang, nothing left
    assert not c.running
    with pytest.raises(ClusterStateError):
        c.run("1", show=False)


def _pid():
    return os.getpid()


def test_the_dashboard_shows_a_keep_restart_as_an_event(world):
    from nbdist.display import Dashboard, render
    from nbdist.telemetry import tracing

    c = world(1)
    tracing.clear()
    for _ in range(30):
        rpc.rpc_sync("worker1", _pid)
    c.restart(keep=True, quiet=True)
    for _ in range(30):
        rpc.rpc_sync("worker1", _pid)
    d = Dashboard(widgets=False)
    try:
        snap = d.snapshot()
        assert snap.events[-1]["kind"] == "restart" and "kept state: 1" in \
            snap.events[-1]["text"]
        assert "last restart" in snap.title
        fig = render.latency_figure(snap)
        dotted = [ln for ax in fig.axes for ln in ax.lines if ln.get_linestyle() == ":"]
        assert len(dotted) >= 2  # the event in both RPC panels
        assert render.to_png(render.dashboard_figure(snap)).startswith(b"\x89PNG")
    finally:
        d.close()


def test_keep_restart_in_a_world_without_rpc(world, capsys):
    """Issue 18 with issue 19's --no-rpc: the group is rebuilt, the kept ranks' state stays."""
    import torch.distributed as dist

    c = world(2, rpc=False)
    c.run(MARK, show=False)
    os.kill(c.ranks[2].pid, signal.SIGKILL)
    wait_until(lambda: not c.ranks[2].alive, 10.0, "rank 2 to be marked dead")
    capsys.readouterr()
    c.restart(3, keep=True)
    assert "kept state: 1; fresh: 2 (killed by SIGKILL" in capsys.readouterr().out
    assert _markers(c) == {1: _pid_marker(c, 1), 2: None, 3: None}
    exec_id = c.send_cell("import torch, torch.distributed as dist\nt = torch.ones(1)\n"
                          "dist.all_reduce(t)\nint(t.item())", [1, 2, 3])
    mine = torch.ones(1)
    dist.all_reduce(mine)
    assert c.report(c.collect(exec_id, [1, 2, 3], 60), [1, 2, 3], show=False) == \
        {1: "4", 2: "4", 3: "4"}
    assert mine.item() == 4
