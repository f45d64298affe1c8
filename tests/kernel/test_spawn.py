"""Issue 27, item 1: ``mp.spawn`` of a function defined in a cell runs on the ranks of a world.

One real Jupyter kernel for the module: the notebook is process 0, worker i process i.
Spawn's contract is checked as torch states it: it returns when every process returned, a
failure raises ``ProcessRaisedException`` naming the process (with the cell's line in the
traceback), ``join=False`` gives a context whose ``join`` works; plain spawn is untouched
where it would work (an importable function, no world), and ``NBDIST_SPAWN=0`` turns it off.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kernel_helpers import Kernel

SETUP = """\
%load_ext nbdist
import os, time, torch.multiprocessing as mp
def hello(i, n):
    print(f"hello {i} of {n} pid {os.getpid()}")
"""


@pytest.fixture(scope="module")
def k():
    kern = Kernel()
    try:
        rep = kern.execute(SETUP, timeout=120)
        assert rep.status == "ok", rep
        yield kern
        kern.execute("%dist_stop", timeout=60)
    finally:
        kern.close()


@pytest.fixture(autouse=True)
def stopped_after(request):
    """Each test's world ends with it (the leak guard counts its workers)."""
    yield
    if "k" in request.fixturenames:
        request.getfixturevalue("k").execute("%dist_stop", timeout=60)


def world(k: Kernel, n: int) -> None:
    """A fresh world of ``n`` workers."""
    ok(k, f"%dist_stop\n%dist_start {n}")


def ok(k: Kernel, code: str, timeout: float = 120):
    rep = k.execute(code, timeout=timeout)
    assert rep.status == "ok", (rep.stdout, rep.stderr, rep.error)
    return rep


def test_no_world_yet_one_is_started_and_every_index_runs_once(k):
    ok(k, "%dist_stop")
    rep = ok(k, "mp.spawn(hello, args=(3,), nprocs=3, join=True)")
    assert "mp.spawn(hello, nprocs=3) started a world of 3 ranks" in rep.stdout, rep.stdout
    assert f"hello 0 of 3 pid {k.pid}" in rep.stdout  # process 0 is the notebook itself
    for i in (1, 2):
        assert f"[worker{i}] hello {i} of 3 pid" in rep.stdout, rep.stdout
    assert k.value("__import__('nbdist').current().world_size") == 3


def test_same_size_runs_in_the_world_as_it_is(k):
    world(k, 2)
    before = k.value("__import__('nbdist').current().worker_pids()")
    rep = ok(k, "mp.spawn(hello, args=(3,), nprocs=3)")
    assert "restart" not in rep.stdout and "started a world" not in rep.stdout, rep.stdout
    assert "[worker2] hello 2 of 3" in rep.stdout
    assert k.value("__import__('nbdist').current().worker_pids()") == before


def test_another_size_keep_restarts_the_world_and_workers_keep_their_state(k):
    world(k, 2)
    ok(k, "%%dist\nmine = 'kept'")
    rep = ok(k, "mp.spawn(hello, args=(4,), nprocs=4)")
    assert "in a world of 3 ranks: keep-restarted it to 4 ranks" in rep.stdout, rep.stdout
    assert "(kept state: 1, 2)" in rep.stdout
    assert "[worker3] hello 3 of 4" in rep.stdout
    assert k.value("__import__('nbdist').current().run('mine', ranks='1,2', show=False)") == \
        {1: "'kept'", 2: "'kept'"}
    rep = ok(k, "mp.spawn(hello, args=(2,), nprocs=2)")
    assert "keep-restarted it to 2 ranks" in rep.stdout and "[worker1] hello 1 of 2" in rep.stdout


FAILS = """\
def fails_on_one(i):
    if i == 1:
        raise ValueError(f"boom on {i}")
    print("fine", i)
"""


def test_an_exception_on_rank_1_raises_process_raised_exception_naming_it(k):
    world(k, 1)
    ok(k, FAILS)
    rep = ok(k, "try:\n    mp.spawn(fails_on_one, nprocs=2)\n"
                "except mp.ProcessRaisedException as e:\n    caught = e\n"
                "print(caught.error_index, caught.error_pid in "
                "__import__('nbdist').current().worker_pids())")
    assert rep.stdout.strip().splitlines()[-1] == "1 True", rep.stdout
    text = k.value("str(caught)")
    assert "-- Process 1 (worker1) terminated with the following error:" in text
    assert 'raise ValueError(f"boom on {i}")' in text  # the cell's own line
    assert "ValueError: boom on 1" in text and "<dist-cell-" not in text
    rep = k.execute("mp.spawn(fails_on_one, nprocs=2)")  # unhandled: shown as the rank's error
    assert rep.status == "error" and rep.error["ename"] == "SpawnedRankError"
    shown = "\n".join(rep.error["traceback"])
    assert "ProcessRaisedException: -- Process 1 (worker1)" in shown and "boom on 1" in shown
    ok(k, "%%dist\nprint('still here')")  # the world goes on


def test_a_rank_that_raises_inside_a_group_is_named_and_its_peer_comes_back(k, tmp_path):
    """Rank 1 raises after joining a group; process 0 waits for it in an all_reduce, which
    fails at the group's timeout (3 s here). The error names rank 1, the first to fail, not
    process 0's consequence; no group is left on either rank."""
    world(k, 1)
    ok(k, f"import datetime, torch, torch.distributed as dist\n"
          f"def raises_mid_group(i, n):\n"
          f"    dist.init_process_group('gloo', init_method='file://{tmp_path}/store', "
          f"rank=i, world_size=n, timeout=datetime.timedelta(seconds=3))\n"
          f"    model = torch.nn.Linear(2, 2)\n"
          f"    if i == 1:\n"
          f"        raise RuntimeError('rank 1 gives up')\n"
          f"    dist.all_reduce(torch.ones(1))\n")
    t0 = time.monotonic()
    rep = ok(k, "try:\n    mp.spawn(raises_mid_group, args=(2,), nprocs=2)\n"
                "except mp.ProcessRaisedException as e:\n    print(e.error_index, str(e))")
    assert time.monotonic() - t0 < 40, "the all_reduce did not keep to the group's timeout"
    assert rep.stdout.startswith("1") and "rank 1 gives up" in rep.stdout, rep.stdout
    assert "also failed: 0 (worker0: " in rep.stdout
    assert k.value("dist.is_initialized()") is False  # process 0's group went too
    ok(k, "%%dist\nimport torch.distributed as dist\nassert not dist.is_initialized()")


GROUP_DEMO = """\
import torch, torch.distributed as dist
def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
def summed(rank, world_size):
    setup(rank, world_size)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank {rank} of {dist.get_world_size()}: sum {t.item():g}")
    dist.destroy_process_group()
"""


def test_a_spawned_function_joins_a_group_of_the_world_demo_after_demo(k):
    """The tutorial's setup() in a spawned function: init_process_group meets in the world
    (no port 12355), twice in a row; in a world that has a group, the demo does not see it
    (its init makes a group of its own, not 'twice') and gets it back afterwards."""
    world(k, 2)
    ok(k, GROUP_DEMO)
    for _ in range(2):
        rep = ok(k, "mp.spawn(summed, args=(3,), nprocs=3)")
        assert "rank 0 of 3: sum 6" in rep.stdout and "[worker2] rank 2 of 3: sum 6" in rep.stdout
    rep = ok(k, "mp.spawn(summed, args=(2,), nprocs=2)")  # keep-restart to 2 ranks, then join
    assert "[worker1] rank 1 of 2: sum 3" in rep.stdout, rep.stdout
    ok(k, "%dist_stop\n%dist_start 2 --process-group gloo")
    rep = ok(k, "mp.spawn(summed, args=(3,), nprocs=3)")
    assert "[worker1] rank 1 of 3: sum 6" in rep.stdout and "twice" not in rep.stdout + rep.stderr
    # the demo made and ended a group of its own, as a spawned process does; the world's
    # group was hidden from it meanwhile and is back, as a script's parent keeps its own
    assert k.value("(dist.is_initialized(), dist.get_world_size())") == (True, 3)
    rep = ok(k, "mp.spawn(summed, args=(3,), nprocs=3)")  # and the next demo makes its own
    assert "[worker2] rank 2 of 3: sum 6" in rep.stdout


def test_an_exception_on_process_0_names_process_0(k):
    world(k, 1)
    ok(k, "def fails_here(i):\n    if i == 0:\n        raise KeyError('here')\n")
    rep = ok(k, "try:\n    mp.spawn(fails_here, nprocs=2)\n"
                "except mp.ProcessRaisedException as e:\n    print(e.error_index, str(e))")
    assert rep.stdout.startswith("0") and "raise KeyError('here')" in rep.stdout, rep.stdout


def test_sys_exit_0_is_a_success_and_the_rank_lives_on(k):
    world(k, 1)
    ok(k, "import sys\ndef leaves(i):\n    print('leaving', i)\n    sys.exit(0)\n")
    rep = ok(k, "mp.spawn(leaves, nprocs=2)")
    assert "leaving 0" in rep.stdout and "[worker1] leaving 1" in rep.stdout
    ok(k, "%%dist\nprint('alive')")


def test_join_false_returns_a_context_whose_join_works(k, tmp_path):
    world(k, 1)
    gate = tmp_path / "go"
    ok(k, f"def waits(i, gate):\n    while not os.path.exists(gate):\n        time.sleep(0.02)\n"
          f"    print('done', i)\nctx = mp.spawn(waits, args=({str(gate)!r},), nprocs=2, "
          f"join=False)")
    assert k.value("isinstance(ctx, mp.ProcessContext)") is True
    assert k.value("ctx.join(0.2)") is False  # still waiting
    gate.write_text("")
    t0 = time.monotonic()
    ok(k, "while not ctx.join(1.0):\n    pass")
    assert time.monotonic() - t0 < 30
    assert k.value("ctx.join()") is True
    ok(k, "bad = mp.spawn(fails_on_one, nprocs=2, join=False)")
    rep = ok(k, "try:\n    bad.join()\nexcept mp.ProcessRaisedException as e:\n"
                "    print('raised', e.error_index)")
    assert "raised 1" in rep.stdout


def test_ctrl_c_interrupts_every_rank(k):
    world(k, 1)
    ok(k, "def forever(i):\n    while True:\n        time.sleep(0.05)\n")
    msg = k.send("mp.spawn(forever, nprocs=2)")
    time.sleep(2.0)
    k.km.interrupt_kernel()
    rep = k.collect(msg, timeout=60)
    assert rep.status == "error" and rep.error["ename"] == "KeyboardInterrupt", rep
    t0 = time.monotonic()
    rep = ok(k, "%%dist\nprint('free again')", timeout=30)  # the worker is not stuck
    assert "free again" in rep.stdout and time.monotonic() - t0 < 10


MODULE = """\
import os


def write_pid(i, where):
    with open(os.path.join(where, str(i)), "w") as f:
        f.write(str(os.getpid()))
"""


@pytest.mark.slow
def test_plain_spawn_where_it_would_work_and_where_nbdist_spawn_is_0(kernel, tmp_path):
    """An importable function with no world, and NBDIST_SPAWN=0, are torch's own spawn (in a
    kernel of its own: plain spawn leaves multiprocessing's resource tracker running)."""
    (tmp_path / "spawnable_mod.py").write_text(MODULE)
    ok(kernel, SETUP)
    ok(kernel, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport spawnable_mod\n"
               f"mp.spawn(spawnable_mod.write_pid, args=({str(tmp_path)!r},), nprocs=2)")
    pids = {int((tmp_path / str(i)).read_text()) for i in (0, 1)}
    assert len(pids) == 2 and kernel.pid not in pids  # two fresh processes, not the notebook
    assert kernel.value("__import__('nbdist').current() is None")  # no world was started

    rep = ok(kernel, "os.environ['NBDIST_SPAWN'] = '0'\n"
                     "try:\n    mp.spawn(hello, args=(2,), nprocs=2)\n"
                     "except Exception as e:\n"
                     "    print('plain spawn failed:', type(e).__name__)\n"
                     "finally:\n    del os.environ['NBDIST_SPAWN']")
    # the children could not find the cell's function ("Can't get attribute 'hello'", on
    # the kernel's own stderr) and exited: spawn's own error
    assert "plain spawn failed: ProcessExitedException" in rep.stdout, (rep.stdout, rep.stderr)
    assert kernel.value("__import__('nbdist').current() is None")


HOOK = """
import sys
import nbdist.patches.mp_spawn as patch
patch.install()
assert "torch" not in sys.modules  # installing it imports nothing
import torch.multiprocessing as mp
module = sys.modules["torch.multiprocessing.spawn"]
assert mp.start_processes is patch.start_processes is module.start_processes
assert patch.original().__module__ == "torch.multiprocessing.spawn"
assert not any(type(f).__name__ == "_AfterImport" for f in sys.meta_path)  # stepped aside
patch.install()  # again: nothing changes
assert module.start_processes is patch.start_processes
print("patched")
"""


def test_the_patch_waits_for_torch_multiprocessing_and_then_steps_aside():
    out = subprocess.run([sys.executable, "-c", HOOK], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "patched", out.stderr[-2000:]
