"""Big worlds on one machine (issue 52): a world of any size the machine holds starts, where
plain torch's ``init_rpc`` fails at 64 ranks (its shared-memory transport's listener backlog
overflows as every rank connects to rank 0 at once), and rank 0 pays well under a MB per rank.

Which transport a world's RPC uses is read from this process's own sockets: TensorPipe's
shared-memory transport connects over abstract unix sockets, its TCP transport does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from conftest import wait_until

from nbdist.spec import SHM_TRANSPORT_UP_TO, WorldSpec


def _abstract_unix_sockets(pid: int | str = "self") -> int:
    """How many of ``pid``'s open sockets are abstract unix sockets (``@name``)."""
    abstract = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith("@"):
                abstract.add(parts[6])
    mine = 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in abstract:
            mine += 1
    return mine


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("n, transport, want", [
    (3, "auto", None), (SHM_TRANSPORT_UP_TO - 1, "auto", None),
    (SHM_TRANSPORT_UP_TO, "auto", ["uv"]), (255, "auto", ["uv"]),
    (3, "tcp", ["uv"]), (255, "shm", None),
])
def test_transport_follows_the_world_size_unless_asked(n, transport, want):
    spec = WorldSpec(n, rpc_transport=transport).validate()
    assert spec.tp_transports() == want


def test_the_start_deadline_grows_with_the_world_unless_given(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert WorldSpec(3).validate().start_seconds() == 64.0
    assert WorldSpec(255).validate().start_seconds() == 316.0
    assert WorldSpec(255, start_timeout=30).validate().start_seconds() == 30.0
    with pytest.raises(ValueError, match="--start-timeout must be a positive number"):
        WorldSpec(2, start_timeout=0).validate()


def test_a_bad_transport_says_which_ones_exist():
    with pytest.raises(ValueError, match="--rpc-transport takes auto, shm or tcp"):
        WorldSpec(2, rpc_transport="rdma").validate()


def _context_switches(pid: int) -> int:
    """Every thread of ``pid``'s voluntary and involuntary context switches so far."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:
            continue  # a thread that ended meanwhile
    return total


def test_idle_workers_sleep_and_wake_for_what_a_thread_prints_or_logs(world):
    """Issue 52: each idle worker's output and metrics flushers woke 53 times a second (256
    idle ranks took a third of a 2-core machine); they sleep until something is written or
    logged, and what a background thread prints or logs outside any cell still arrives. Over
    TCP: TensorPipe's shared-memory transport spins a reactor thread in every process."""
    import nbdist

    c = world(4, rpc_transport="tcp")
    c.run("x = 1", show=False)
    pids = [c.ranks[r].pid for r in range(1, 5)]
    time.sleep(1.0)
    before, t0 = {p: _context_switches(p) for p in pids}, time.monotonic()
    time.sleep(3.0)
    rates = [(_context_switches(p) - before[p]) / (time.monotonic() - t0) for p in pids]
    assert max(rates) < 15, f"idle workers switched {rates} times a second (was 58)"
    c.run("import nbdist, threading\n"
          "threading.Timer(0.5, lambda: (print('late line'), nbdist.log(late=1))).start()",
          ranks=[3], show=False)
    wait_until(lambda: "late line" in c.logs(3) and nbdist.history(3, "late"), 30,
               "rank 3's background line and record")


def test_a_small_world_keeps_shared_memory_and_a_big_one_uses_tcp(world):
    import torch.distributed.rpc as rpc

    c = world(2)
    c[:].call(os.getpid)
    assert _abstract_unix_sockets() > 0, "a 3-rank world should use TensorPipe's shm transport"
    c.stop()
    c = world(SHM_TRANSPORT_UP_TO, rpc_transport="auto")
    assert rpc.rpc_sync(c.names[-1], os.getpid) == c.ranks[SHM_TRANSPORT_UP_TO].pid
    c[:].call(os.getpid)
    assert _abstract_unix_sockets() == 0, "a big world's RPC should not use shared memory"
    # every rank connects to rank 0 as init_rpc ends: its listeners were given long queues
    assert c._world.rank0.widened, "a big world's join should widen rank 0's listeners"
    if shutil.which("ss"):
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
        mine = [line.split()[2] for line in ss.splitlines() if f"pid={os.getpid()}," in line]
        assert mine and "128" not in mine, f"rank 0's listeners' backlogs: {mine}"


@pytest.mark.slow
def test_128_ranks_start_run_a_cell_answer_a_view_and_stop(world):
    """128 ranks (plain torch's init_rpc fails from 64 here): up, a cell on every worker, a
    view call, and rank 0's memory grew by well under a MB per rank (torch's shared-memory
    transport costs about 17 MB per peer); the leak guard checks nothing is left."""
    before = _rss_mb()
    c = world(127, start_timeout=240)
    result = c.run("import os\nos.getpid()", show=False)
    pids = c[:].call(os.getpid)
    want = {r: c.ranks[r].pid for r in range(1, 128)}
    assert {r: int(v) for r, v in result.items()} == want
    assert dict(pids) == want
    grown = _rss_mb() - before
    assert grown < 127 * 1.0, f"rank 0 grew {grown:.0f} MB for 127 peers"
