"""Behaviour 3 and 4: errors explain themselves; dead workers and Ctrl-C never hang anything."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import nbdist
from nbdist.errors import DistCellError, DistTimeoutError, StartError, WorkerDiedError


def _poll(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def _state(c, rank: int) -> str:
    return next(r["state"] for r in c.status().rows if r["rank"] == rank)


def test_dist_cell_failure_names_ranks_and_keeps_others_output(ipython, capsys):
    ipython.run_line_magic("dist_start", "3")
    capsys.readouterr()
    with pytest.raises(DistCellError) as info:
        ipython.run_cell_magic("dist", "", "import os\nrank = int(os.environ['NBDIST_RANK'])\n"
                                           "print('before', rank)\n"
                                           "if rank != 2:\n    raise KeyError(f'no key {rank}')\n"
                                           "'ok'")
    out, _ = capsys.readouterr()
    for r in (1, 2, 3):
        assert f"[worker{r}] before {r}" in out
    assert "[worker2] 'ok'" in out
    err = info.value
    assert sorted(f.rank for f in err.failures) == [1, 3]
    assert "ranks 1 (worker1), 3 (worker3)" in str(err)
    rendered = "\n".join(err._render_traceback_())
    assert "KeyError" in rendered and "no key 3" in rendered
    assert "raise KeyError(f'no key {rank}')" in rendered  # the cell's own line
    assert "nbdist/worker.py" not in rendered  # our frames are not the user's business


@pytest.mark.parametrize("how, expect", [
    ("os.kill(os.getpid(), 9)", "killed by SIGKILL"),
    ("os._exit(3)", "exited with code 3"),
    ("import ctypes; ctypes.string_at(0)", "SIGSEGV"),
])
def test_dead_worker_detected_and_explained(world, how, expect):
    c = world(2)
    t0 = time.monotonic()
    with pytest.raises(DistCellError) as info:
        c.run(f"import os\n{how}", ranks=[2], show=False)
    assert time.monotonic() - t0 < 3
    assert expect in str(info.value)
    assert _poll(lambda: expect in _state(c, 2), 2.0), _state(c, 2)
    assert _state(c, 1) == "alive"
    with pytest.raises(WorkerDiedError, match="rank 2"):
        c.run("1", ranks=[2])
    assert c.run("40 + 2", ranks=[1], show=False) == {1: "42"}


def test_rpc_waiting_on_a_worker_that_dies_fails_fast_and_names_it(world):
    import torch.distributed.rpc as rpc

    c = world(2)
    pid = c.ranks[2].pid
    threading.Timer(0.5, os.kill, args=(pid, signal.SIGKILL)).start()
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:
        rpc.rpc_sync("worker2", time.sleep, args=(30,))
    assert time.monotonic() - t0 < 5
    assert "worker2" in str(info.value)


def test_worker_failing_at_startup_is_reported_and_nothing_is_left(monkeypatch):
    monkeypatch.setenv("NBDIST_TEST_FAIL_RANK", "2")
    t0 = time.monotonic()
    with pytest.raises(StartError) as info:
        nbdist.start(2, quiet=True, start_timeout=30)
    assert time.monotonic() - t0 < 10
    msg = str(info.value)
    assert "rank 2 (worker2)" in msg and "fails at start-up on purpose" in msg
    assert nbdist.current() is None
    monkeypatch.delenv("NBDIST_TEST_FAIL_RANK")
    c = nbdist.start(1, quiet=True)  # and the process can start a good world afterwards
    try:
        assert c.run("1+1", show=False) == {1: "2"}
    finally:
        c.stop()


def _interrupt_soon(delay: float) -> threading.Timer:
    t = threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGINT))
    t.start()
    return t


def test_ctrl_c_during_dist_cell_returns_fast_and_world_stays_usable(world):
    c = world(2)
    _interrupt_soon(0.5)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        c.run("import time\nwhile True:\n    time.sleep(0.05)", show=False)
    assert time.monotonic() - t0 < 3.0  # 2 s asked; slack for a loaded CI machine
    assert c.run("'still here'", show=False) == {1: "'still here'", 2: "'still here'"}


def test_ctrl_c_during_blocking_rpc_interrupts_remote_work(world):
    import torch.distributed.rpc as rpc

    c = world(1)
    c.run("import time\nstate = {'stopped': False, 'running': False}", show=False)
    code = ("def spin():\n"
            "    state['running'] = True\n"
            "    try:\n"
            "        while True:\n"
            "            sum(range(1000))\n"
            "    except KeyboardInterrupt:\n"
            "        state['stopped'] = True\n"
            "        raise\n")
    c.run(code, show=False)
    sent = []

    def interrupt_once_spinning() -> None:  # Ctrl-C while the remote function really runs
        _poll(lambda: c.run("state['running']", show=False) == {1: "True"}, 30)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_spinning, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        rpc.rpc_sync("worker1", _remote_spin)
    assert time.monotonic() - sent[0] < 3.0  # 2 s asked; slack for a loaded CI machine
    ok = _poll(lambda: c.run("state['stopped']", show=False) == {1: "True"}, 3.0)
    assert ok, c.run("import nbdist.patches.rpc_hooks as h\n(state, h._active)", show=False)
    assert rpc.rpc_sync("worker1", os.getpid) == c.ranks[1].pid


def _remote_spin():
    import __main__

    return __main__.spin()


def test_dist_timeout_interrupts_and_names_ranks(world):
    c = world(2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        c.run("import time, os\nif os.environ['NBDIST_RANK'] == '2':\n    time.sleep(60)",
              timeout=1.0, show=False)
    assert time.monotonic() - t0 < 4
    assert "rank 2 (worker2)" in str(info.value) and "rank 1" not in str(info.value)
    assert c.run("'ok'", ranks=[2], show=False) == {2: "'ok'"}


def test_start_timeout_leaves_no_joining_thread_and_the_next_start_works(monkeypatch):
    """A rank that never joins: the start fails by its deadline naming it, and rank 0's own
    init_rpc thread ends too (bounded by the same deadline, not torch's 24-day Gloo wait)."""
    nbdist.start(1, quiet=True).stop()  # the template is warm: the 4 s are the workers'
    monkeypatch.setenv("NBDIST_TEST_STALL_RANK", "2")
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError) as info:
        nbdist.start(2, quiet=True, start_timeout=4)
    assert "rank 2 (worker2)" in str(info.value)
    assert time.monotonic() - t0 < 4 + 30  # "it hangs" bound: the deadline plus teardown
    deadline = time.monotonic() + 4 + 30
    while any(t.name == "nbdist-join" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "rank 0's init_rpc thread outlived its deadline"
        time.sleep(0.1)
    monkeypatch.delenv("NBDIST_TEST_STALL_RANK")
    c = nbdist.start(2, quiet=True)
    try:
        assert c.run("1+1", show=False) == {1: "2", 2: "2"}
    finally:
        c.stop()
