"""One object describes the world a process is in (issue 34): made on first use, closed and
dropped as the process leaves, empty in a forked child; a real world leaves nothing of itself."""

from __future__ import annotations

import os

import torch
import torch.distributed.rpc as rpc

from nbdist import world_state
from nbdist.parallel import sync
from nbdist.patches import rpc_hooks
from nbdist.shm import transport as shm
from nbdist.telemetry import tracing


class _Part:
    closed: list[str] = []  # the test's own record of closings

    def __init__(self) -> None:
        self.name = type(self).__name__
        self.forked = False

    def close(self) -> None:
        _Part.closed.append(self.name)

    def in_forked_child(self) -> None:
        self.forked = True


class _First(_Part):
    pass


class _Second(_Part):
    def close(self) -> None:
        super().close()
        raise RuntimeError("a part that fails to close")


class _NoClose:
    pass


def test_parts_are_made_once_closed_newest_first_and_dropped_at_the_end():
    world_state.end()
    _Part.closed = []
    first = world_state.part(_First)
    assert world_state.part(_First) is first and world_state.peek(_First) is first
    world_state.part(_Second)
    world_state.part(_NoClose)
    assert world_state.peek(_Part) is None
    world_state.end()  # _Second's failure does not keep _First open
    assert _Part.closed == ["_Second", "_First"]
    assert world_state.peek(_First) is None
    assert world_state.part(_First) is not first  # the next world starts from nothing
    world_state.end()


def test_a_forked_child_is_in_no_world():
    world_state.end()
    parent = world_state.part(_First)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: tell the parent what it sees, then leave at once
        ok = world_state.peek(_First) is None and parent.forked
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1", "the child saw its parent's world"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert world_state.peek(_First) is parent and not parent.forked
    world_state.end()


def _plus_one(x):
    return x + 1


def _fails():
    raise ValueError("on purpose")


def test_a_world_leaves_nothing_of_itself(world, monkeypatch):
    monkeypatch.setenv("NBDIST_SHM", "1")
    monkeypatch.setenv("NBDIST_SHM_MIN_KB", "1024")
    c = world(1)
    big = torch.arange(1 << 19, dtype=torch.float32)  # 2 MB: the shared-memory path
    assert torch.equal(rpc.rpc_sync("worker1", _plus_one, args=(big,)), big + 1)
    assert shm.usage() is not None and world_state.peek(shm._ShmWorld).arena is not None
    try:
        rpc.rpc_sync("worker1", _fails)
    except ValueError:
        pass
    assert rpc_hooks.last_failed_destination() == "worker1"
    assert world_state.peek(tracing._TracedWorld).armed
    sync._state()[("a",)] = {}
    c.stop()
    assert world_state.current()._parts == {}, "a part of the stopped world stayed"
    assert shm.usage() is None and rpc_hooks.last_failed_destination() is None
    assert not tracing._SWITCH_PER_PROCESS.on and sync._state() == {}
    c = world(1)  # and the next world works from nothing
    assert torch.equal(rpc.rpc_sync("worker1", _plus_one, args=(big,)), big + 1)
    assert shm.usage()["sent"] >= 1


def test_parts_close_before_torchs_shutdown_and_what_it_touches_goes_with_the_world():
    world_state.end()
    _Part.closed = []
    world_state.part(_First)
    seen = []

    def torch_own():  # stands where rpc.shutdown runs: a late RPC touches a part
        seen.append(list(_Part.closed))
        world_state.part(_Second)

    world_state.end(then=torch_own)
    assert seen == [["_First"]], "the world's parts were not closed before torch's shutdown"
    assert _Part.closed == ["_First", "_Second"], "a part made during the shutdown stayed open"
    assert world_state.peek(_First) is None and world_state.peek(_Second) is None


_CHILD_GROUP = """
import os, sys, socket, torch
import torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
pid = os.fork()
if pid == 0:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        t = torch.ones(2)
        dist.all_reduce(t)
        print("CHILD", dist.get_world_size(), dist.get_rank(), t.tolist(), flush=True)
        dist.destroy_process_group()
    finally:
        os._exit(0)
os.waitpid(pid, 0)
"""


def test_a_child_forked_from_a_rank_makes_torchs_own_group(world, capfd):
    """A child forked from a rank is in no world (issue 42): its ``init_process_group`` is
    torch's, with the address it names, as the same code forked from a script's process."""
    import subprocess
    import sys

    script = subprocess.run([sys.executable, "-c", _CHILD_GROUP], capture_output=True,
                            text=True, timeout=120)
    reference = [ln for ln in script.stdout.splitlines() if ln.startswith("CHILD")]
    assert reference == ["CHILD 1 0 [1.0, 1.0]"], script.stdout + script.stderr
    world(1)
    capfd.readouterr()
    exec(compile(_CHILD_GROUP, "<cell>", "exec"), {"__name__": "__cell__"})
    out, err = capfd.readouterr()
    assert [ln for ln in out.splitlines() if ln.startswith("CHILD")] == reference, out + err
    assert "private rendezvous" not in err, "the forked child joined its parent's world"
