"""Issue 7, point 2: Ctrl-C is safe at any moment, even while workers pour out output.

Real worlds, real SIGINTs at random moments: in this process (rank 0 is the pytest process)
and in a real Jupyter kernel. After every interrupt the world must answer a trivial cell and a
plain ``rpc_sync`` to each worker, and no RPC function may stay registered as running.
The seed is printed and named in every failure; ``NBDIST_INTERRUPT_SEED`` replays a run.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import queue
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from conftest import wait_until
from kernel_helpers import Kernel

ROUNDS = 50
KERNEL_ROUNDS = 10
MAX_DELAY = 0.3  # seconds from the start of a workload to its Ctrl-C
WORKLOAD_TIMEOUT = 20.0  # a workload that is never interrupted still ends
CHECK_TIMEOUT = 10.0

# A "notebook cell": its function lives in a __main__ that workers don't have, so it travels
# by value, exactly like a function defined in a Jupyter cell.
_CELL = """
import time

def chatty(n):
    for i in range(n):
        print('y' * 3000)
        if i % 20 == 0:
            time.sleep(0.001)
"""
_cell_ns: dict = {"__name__": "__main__"}
exec(compile(_CELL, "<notebook-cell-chatty>", "exec"), _cell_ns)
chatty: Callable[[int], None] = _cell_ns["chatty"]

_PRINT_CELL = "for i in range(10**6):\n    print('x' * 3000)"
_LOG_CELL = "import nbdist\nfor i in range(10**7):\n    nbdist.log(v=i, w=2.5)"
_ACTIVE = "import nbdist.patches.rpc_hooks as h\nlen(h._ACTIVE_PER_PROCESS)"


def _seed() -> int:
    seed = int(os.environ.get("NBDIST_INTERRUPT_SEED", time.time_ns() % 2**32))
    print(f"interrupt test seed: {seed} (NBDIST_INTERRUPT_SEED={seed} replays it)")
    return seed


class _Sink(io.TextIOBase):
    """Stands in for stdout while workers flood it: counts characters, keeps the tail."""

    def __init__(self) -> None:
        self.chars = 0
        self.tail = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.chars += len(s)
        self.tail = (self.tail + s)[-2000:]
        return len(s)


def _ctrl_c_main_thread() -> None:
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _interrupted(work: Callable[[], object], delay: float) -> bool:
    """Run ``work`` and press Ctrl-C ``delay`` seconds in; True when KeyboardInterrupt came.

    The interrupt is always consumed here: if the workload ended first we wait (1 s at most)
    for it, so it cannot land in the checks that follow or escape into pytest.
    """
    timer = threading.Timer(delay, _ctrl_c_main_thread)
    try:
        timer.start()
        work()
    except KeyboardInterrupt:
        timer.join(5.0)
        return True
    try:
        timer.join(5.0)
        give_up = time.monotonic() + 1.0
        while time.monotonic() < give_up:
            time.sleep(0.005)
    except KeyboardInterrupt:
        pass
    return False


def _check_world(c, names: dict[int, str], pids: dict[int, int]) -> None:
    """The world answers: a trivial cell, plain RPCs to each worker, no RPC left running."""
    import torch.distributed.rpc as rpc

    got = c.run("1+1", timeout=CHECK_TIMEOUT, show=False)
    assert got == {1: "2", 2: "2"}, f"trivial cell answered {got}"
    for rank, name in names.items():
        for _ in range(3):  # different pool threads: a stale interrupt would hit one of them
            pid = rpc.rpc_sync(name, os.getpid, timeout=CHECK_TIMEOUT)
            assert pid == pids[rank], f"rpc_sync to {name} returned {pid}"
    active = {}

    def none_running() -> bool:  # the interrupted RPC function left the callee's bookkeeping
        active.update(c.run(_ACTIVE, timeout=CHECK_TIMEOUT, show=False))
        return active == {1: "0", 2: "0"}

    try:
        wait_until(none_running, 5.0, "no RPC function registered as running")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still running: {active} (rank -> count)") from None


def test_fifty_random_interrupts_leave_the_world_usable(world, ctrl_c):
    import torch.distributed.rpc as rpc

    seed = _seed()
    rng = random.Random(seed)
    c = world(2)
    names = {r: c.names[r] for r in (1, 2)}
    pids = {r: c.ranks[r].pid for r in (1, 2)}
    workloads: dict[str, Callable[[int], object]] = {
        "print-heavy %%dist cell":
            lambda rank: c.run(_PRINT_CELL, timeout=WORKLOAD_TIMEOUT, show=False),
        "rpc_sync of a printing notebook function":
            lambda rank: rpc.rpc_sync(names[rank], chatty, args=(10**6,),
                                      timeout=WORKLOAD_TIMEOUT),
        "nbdist.log loop in a %%dist cell":
            lambda rank: c.run(_LOG_CELL, timeout=WORKLOAD_TIMEOUT, show=False),
    }
    sink = _Sink()
    t0 = time.monotonic()
    for rnd in range(1, ROUNDS + 1):
        kind = rng.choice(sorted(workloads))
        delay = round(rng.uniform(0.0, MAX_DELAY), 3)
        rank = rng.choice((1, 2))
        where = (f"round {rnd}/{ROUNDS}, workload {kind!r} (rank {rank} for RPC), "
                 f"Ctrl-C after {delay * 1000:.0f} ms, seed {seed}")
        started = time.monotonic()
        try:
            with contextlib.redirect_stdout(sink):
                hit = _interrupted(functools.partial(workloads[kind], rank), delay)
                _check_world(c, names, pids)
        except Exception as exc:  # noqa: BLE001 - turned into a failure naming the round
            pytest.fail(f"{where}: the world did not answer after the interrupt: "
                        f"{type(exc).__name__}: {exc}\n--- last output ---\n{sink.tail}")
        assert hit, f"{where}: the workload ended without being interrupted"
        assert time.monotonic() - started < 15, f"{where}: the round took too long"
    print(f"{ROUNDS} rounds in {time.monotonic() - t0:.1f}s, {sink.chars / 1e6:.0f} MB of "
          "worker output shown")


def _short(i: int) -> int:
    """A quick RPC function that prints, so the callee's after-call flush has work to do."""
    for k in range(4):
        print(f"short call {i}.{k}")
        sum(range(500))
    return i


_CLEAN = "RuntimeError: KeyboardInterrupt: On WorkerInfo("
_INJECTOR = """
import sys, threading, time
import nbdist.patches.rpc_hooks as h
def _inject(seconds):
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over often: interrupts land on any bytecode
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            h.interrupt_rpc_threads()
            time.sleep(0.0001)
    finally:
        sys.setswitchinterval(switch)
injector = threading.Thread(target=_inject, args=({seconds},), daemon=True)
injector.start()
"""


@pytest.mark.slow  # a 4 s hail of interrupts
def test_interrupts_landing_as_rpc_functions_return_leave_no_trace(world):
    """The callee's bookkeeping under a hail of interrupts: they land on every bytecode of
    ``_run_function`` (entering, the function, leaving, the after-call flush). Afterwards no
    thread is registered as running and no stale interrupt hits a later RPC."""
    import torch.distributed.rpc as rpc

    c = world(1)
    name = c.names[1]
    outcomes: dict[str, int] = {}
    sink = _Sink()
    with contextlib.redirect_stdout(sink):
        c.run(_INJECTOR.format(seconds=4.0), timeout=CHECK_TIMEOUT, show=False)
        deadline = time.monotonic() + 4.0
        i = 0
        while time.monotonic() < deadline:
            i += 1
            try:
                assert rpc.rpc_sync(name, _short, args=(i,), timeout=CHECK_TIMEOUT) == i
                kind = "ok"
            except Exception as exc:  # noqa: BLE001 - tallied, asserted below
                # an interrupt that stopped the function comes back as its remote exception,
                # raised by torch as RuntimeError("KeyboardInterrupt: On WorkerInfo(...")
                text = f"{type(exc).__name__}: {exc}"
                kind = "interrupted" if text.startswith(_CLEAN) else text[:300]
            outcomes[kind] = outcomes.get(kind, 0) + 1
        assert c.run("injector.join(10)\ninjector.is_alive()", timeout=CHECK_TIMEOUT,
                     show=False) == {1: "False"}
        active = c.run(_ACTIVE, timeout=CHECK_TIMEOUT, show=False)
        after = [rpc.rpc_sync(name, _short, args=(k,), timeout=CHECK_TIMEOUT)
                 for k in range(200)]
    print(f"{i} calls under interrupts: {outcomes}")
    assert active == {1: "0"}, f"RPC threads still registered as running: {active} ({outcomes})"
    assert after == list(range(200))
    escaped = {k: n for k, n in outcomes.items() if k not in ("ok", "interrupted")}
    assert not escaped, f"interrupts escaped the RPC function's bookkeeping: {escaped}"
    assert outcomes.get("interrupted", 0) > 0, f"no call was interrupted: {outcomes}"


# ---------------------------------------------------------------- in a real Jupyter kernel

def _reply(k: Kernel, msg_id: str, timeout: float) -> dict | None:
    """The shell reply to ``msg_id`` (None if none came in ``timeout`` s), draining iopub.

    Under a flood of output the kernel's iopub drops messages (zmq's high-water mark), idle
    status included, so only the shell reply says reliably that a cell ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _discard_iopub(k)
        try:
            reply = k.kc.get_shell_msg(timeout=0.1)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]
    return None


def _discard_iopub(k: Kernel, budget: float = 0.05) -> None:
    """Read and drop what iopub holds (for ``budget`` s at most), so the flood keeps moving."""
    give_up = time.monotonic() + budget
    while time.monotonic() < give_up:
        try:
            k.kc.get_iopub_msg(timeout=0.001)
        except queue.Empty:
            return


def _await_started(k: Kernel, msg_id: str, timeout: float) -> bool:
    """Wait for the kernel to begin the cell (its execute_input), so Ctrl-C reaches it;
    False if that message never showed (iopub may drop it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if (msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "execute_input"):
            return True
    return False


_ANSWER = {"v": "nbdist.current().run('1+1', show=False, timeout=10)"}


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.close()


@pytest.mark.kernel
def test_random_interrupts_in_a_real_kernel(kernel):
    seed = _seed()
    rng = random.Random(seed)
    rep = kernel.execute("%load_ext nbdist\n%dist_start 2\nimport nbdist", timeout=120)
    assert rep.status == "ok" and "3 ranks ready" in rep.stdout, rep
    for rnd in range(1, KERNEL_ROUNDS + 1):
        delay = round(rng.uniform(0.0, MAX_DELAY), 3)
        where = f"round {rnd}/{KERNEL_ROUNDS}, Ctrl-C after {delay * 1000:.0f} ms, seed {seed}"
        _discard_iopub(kernel, 1.0)
        # stop_on_error=False: ipykernel must not abort the next cell for this one's error
        msg = kernel.kc.execute(f"%%dist\n{_PRINT_CELL}", stop_on_error=False)
        _await_started(kernel, msg, 10)
        time.sleep(delay)
        ended, t_int = None, time.monotonic()
        for presses in range(1, 4):  # noqa: B007 - a Ctrl-C before the cell began is ignored
            kernel.km.interrupt_kernel()
            ended = _reply(kernel, msg, 10)
            if ended is not None:
                break
        assert ended is not None, f"{where}: the interrupted cell did not end in 30 s"
        assert ended["status"] == "error", f"{where}: the cell ended {ended['status']}"
        t0 = time.monotonic()
        done = None
        while time.monotonic() - t0 < CHECK_TIMEOUT + 5:
            trivial = kernel.kc.execute("%%dist\n1+1", user_expressions=_ANSWER)
            done = _reply(kernel, trivial, CHECK_TIMEOUT + 5 - (time.monotonic() - t0))
            if done is None or done["status"] != "aborted":  # aborted: not run, ask again
                break
        assert done is not None, f"{where}: the trivial %%dist cell after it did not answer"
        took = time.monotonic() - t0
        value = done.get("user_expressions", {}).get("v", {})
        ok = (done["status"] == "ok" and value.get("status") == "ok"
              and value["data"]["text/plain"] == "{1: '2', 2: '2'}")
        assert ok, f"{where}: the trivial cell after it answered {done}"
        assert took < CHECK_TIMEOUT, f"{where}: the trivial cell took {took:.1f}s"
        print(f"{where}: {presses} Ctrl-C, cell ended in {t0 - t_int:.1f}s, "
              f"trivial cell {took:.2f}s")
    stopped = _reply(kernel, kernel.send("%dist_stop"), 30)
    assert stopped is not None and stopped["status"] == "ok", stopped


_SLEEPER_CELL = """
import time

def sleeper(seconds, _slow=None):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    return "slept"


class SlowToUnpickle:
    # an argument the worker takes 0.5 s to unpickle: the call starts only after that

    def __setstate__(self, state):
        time.sleep(0.5)
        self.__dict__.update(state)
        open(state["marker"], "w").close()  # unpickled: the call starts right after
"""
exec(compile(_SLEEPER_CELL, "<notebook-cell-sleeper>", "exec"), _cell_ns)
sleeper: Callable[..., str] = _cell_ns["sleeper"]
SlowToUnpickle = _cell_ns["SlowToUnpickle"]


@pytest.mark.slow
def test_ctrl_c_right_after_sending_stops_the_call_before_it_starts(world, ctrl_c, tmp_path):
    """Ctrl-C a millisecond or two after ``rpc_sync`` sent its request: the call may not be
    running on the worker yet (on the wire, being unpickled); it must still be stopped when
    it starts, not run on for its 30 s."""
    import torch.distributed.rpc as rpc

    c = world(1)
    marker = tmp_path / "unpickled"
    slow = SlowToUnpickle()
    slow.marker = str(marker)
    for delay, arg in ((0.001, None), (0.1, slow)):  # the second lands while it unpickles
        assert _interrupted(lambda a=arg: rpc.rpc_sync(c.names[1], sleeper, args=(30.0, a)),
                            delay)
        if arg is not None:
            wait_until(marker.exists, 10.0, "the worker to finish unpickling the call")
        wait_until(lambda: c.run(_ACTIVE, show=False) == {1: "0"}, 10.0,
                   f"the call interrupted {delay * 1000:.0f} ms after sending to end on "
                   "the worker")
        assert rpc.rpc_sync(c.names[1], os.getpid) == c.ranks[1].pid  # later calls are fine


def test_ctrl_c_stops_cells_still_on_their_way(world, tmp_path):
    """An interrupt stops the cell a worker runs and every cell sent before it that has not
    begun (it would otherwise run once the interrupted one ended, to its end)."""
    c = world(1)
    marker = tmp_path / "ran"
    first = c.send_cell("import time\ntime.sleep(30)", [1])
    queued = c.send_cell(f"open({str(marker)!r}, 'w').close()", [1])
    c.interrupt([1])
    got = {cell: c.collect(cell, [1], 10.0)[1] for cell in (first, queued)}
    assert [r.error_type for r in got.values()] == ["KeyboardInterrupt"] * 2, got
    assert not marker.exists()
    assert c.run("6 * 7", show=False) == {1: "42"}  # the next cell runs as usual


def _stops_within_seconds(c, code: str) -> None:
    """Send ``code`` to worker1, Ctrl-C it a second later: KeyboardInterrupt within 5 s, and
    the next cell runs as usual."""
    cell = c.send_cell(code, [1])
    time.sleep(1.0)  # where the Ctrl-C is meant to land by now
    t0 = time.monotonic()
    c.interrupt([1])
    got = c.collect(cell, [1], 10.0)[1]
    assert got.error_type == "KeyboardInterrupt", got
    assert time.monotonic() - t0 < 5.0
    assert c.run("6 * 7", show=False) == {1: "42"}


SWALLOWED = """
import time
class Slow:
    def __del__(self):
        print("in __del__", flush=True)
        time.sleep(30)  # Ctrl-C lands here: Python reports it and swallows it
slow = Slow()
del slow
time.sleep(30)
"""


def test_ctrl_c_that_python_swallowed_is_sent_again(world):
    """A KeyboardInterrupt raised in a finalizer never reaches the cell (Python prints
    "Exception ignored" and goes on): the worker signals again, and the cell stops."""
    c = world(1)
    _stops_within_seconds(c, SWALLOWED)  # the cell sleeps in __del__ when Ctrl-C comes


def test_ctrl_c_that_the_cell_catches_is_not_sent_again(world):
    """A cell that catches the KeyboardInterrupt and cleans up is left to finish: one Ctrl-C
    is one KeyboardInterrupt."""
    c = world(1)
    cell = c.send_cell("import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n"
                       "    time.sleep(2.0)  # cleaning up, longer than a re-signal's wait\n"
                       "'cleaned up'", [1])
    time.sleep(0.5)
    c.interrupt([1])
    got = c.collect(cell, [1], 10.0)[1]
    assert (got.status, got.value) == ("ok", "'cleaned up'"), got


SLOW_PRE_RUN = """
ip = get_ipython()
def _slow_pre_run(info):
    ip.events.unregister("pre_run_cell", _slow_pre_run)
    import time
    time.sleep(3)  # Ctrl-C lands here: IPython's trigger catches it
ip.events.register("pre_run_cell", _slow_pre_run)
"""


def test_ctrl_c_in_ipythons_event_hooks_is_sent_again(world):
    """A cell on IPython's own path (here: the word async) whose pre-run hook the Ctrl-C hit:
    IPython's trigger catches the KeyboardInterrupt and runs the cell; the worker signals
    again and the cell stops."""
    c = world(1)
    c.run(SLOW_PRE_RUN, show=False)
    _stops_within_seconds(c, "import time  # async: IPython's own path\ntime.sleep(30)")
