"""What the RPC fast path must not change: a notebook function's code goes to each rank once
and is named by digest afterwards, yet what runs is always the function as it is now."""

from __future__ import annotations

import pytest
from conftest import ev

SETUP = '''
import torch
import torch.distributed.rpc as rpc
K = 1
def f(x):
    return ("v1", x + K)
'''
RANKS = ("obs1", "obs2", "obs3")


@pytest.fixture
def shell(ipython):
    ipython.run_line_magic("dist_start", "3 --name agent --worker-name obs{rank}")
    assert ipython.run_cell(SETUP).success
    return ipython


def on_every_rank(shell, call: str) -> list:
    return [ev(shell, call.replace("RANK", repr(r))) for r in RANKS]


def test_redefined_function_runs_on_every_rank(shell):
    for _ in range(3):  # the code is cached on every rank after the first call
        assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(1,))") == [("v1", 2)] * 3
    assert shell.run_cell("def f(x):\n    return ('v2', x * 10)\n").success
    assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(1,))") == [("v2", 10)] * 3
    assert on_every_rank(shell, "rpc.rpc_async(RANK, f, args=(2,)).wait()") == [("v2", 20)] * 3
    assert on_every_rank(shell, "rpc.remote(RANK, f, args=(3,)).to_here()") == [("v2", 30)] * 3
    # the same source defined again is a new function too; and back to the first one
    assert shell.run_cell("def f(x):\n    return ('v3', x)\n").success
    assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(5,))") == [("v3", 5)] * 3


def test_globals_closures_defaults_and_attributes_travel_every_call(shell):
    assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(1,))") == [("v1", 2)] * 3
    assert shell.run_cell("K = 100").success  # f itself unchanged: its code stays cached
    assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(1,))") == [("v1", 101)] * 3
    code = ("def make(k):\n    def g(x):\n        return x * k\n    return g\n"
            "g2, g3 = make(2), make(3)\n")
    assert shell.run_cell(code).success  # one code object, two closures
    assert ev(shell, "[rpc.rpc_sync('obs1', g, args=(5,)) for g in (g2, g3, g2)]") == [10, 15, 10]
    assert shell.run_cell("def h(x, y=1):\n    return x + y + getattr(h, 'extra', 0)\n").success
    assert ev(shell, "rpc.rpc_sync('obs2', h, args=(1,))") == 2
    assert shell.run_cell("h.__defaults__ = (10,); h.extra = 100").success
    assert ev(shell, "rpc.rpc_sync('obs2', h, args=(1,))") == 111


def test_helpers_recursion_and_methods_of_a_redefined_class(shell):
    code = ("def helper(x):\n    return x + 1\n"
            "def fact(n):\n    return 1 if n <= 1 else n * fact(n - 1)\n"
            "def uses(x):\n    return helper(x)\n")
    assert shell.run_cell(code).success
    assert ev(shell, "rpc.rpc_sync('obs1', fact, args=(5,))") == 120
    assert ev(shell, "rpc.rpc_sync('obs1', uses, args=(1,))") == 2
    assert shell.run_cell("def helper(x):\n    return x + 1000\n").success  # uses unchanged
    assert ev(shell, "rpc.rpc_sync('obs1', uses, args=(1,))") == 1001
    cls = "class C:\n    def m(self, x):\n        return x + {}\n"
    assert shell.run_cell(cls.format(1)).success
    assert ev(shell, "rpc.remote('obs3', C).rpc_sync().m(1)") == 2
    assert shell.run_cell(cls.format(2)).success
    assert ev(shell, "rpc.remote('obs3', C).rpc_sync().m(1)") == 3


def test_many_pipelined_calls_of_a_new_function(shell):
    """The first request carries the code, the next ones only its digest; the callee may
    unpickle them in any order on its thread pool."""
    assert shell.run_cell("def fresh(i):\n    return i * 2\n").success
    got = ev(shell, "[fu.wait() for fu in [rpc.rpc_async('obs1', fresh, args=(i,)) "
                    "for i in range(200)]]")
    assert got == [i * 2 for i in range(200)]


def test_a_new_world_gets_the_code_again(shell):
    assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(1,))") == [("v1", 2)] * 3
    shell.run_line_magic("dist_restart", "3")
    assert on_every_rank(shell, "rpc.rpc_sync(RANK, f, args=(1,))") == [("v1", 2)] * 3


def test_remote_traceback_still_shows_the_cell_after_the_code_was_cached(shell, capsys):
    bad = "def boom(x):\n    raise ValueError('no ' + str(x))\n"
    assert shell.run_cell(bad).success
    for _ in range(2):  # the second call sends only the digest
        res = shell.run_cell("rpc.rpc_sync('obs2', boom, args=(7,))")
        assert isinstance(res.error_in_exec, ValueError)
        assert "no 7" in str(res.error_in_exec)
        assert "raise ValueError('no ' + str(x))" in str(res.error_in_exec)


KEEP = '''
import threading
def bump_local():
    import sys
    import threading
    holder = sys.modules.setdefault("_nbdist_test_locals", type(sys)("_nbdist_test_locals"))
    if not hasattr(holder, "local"):
        holder.local = threading.local()
    holder.local.n = getattr(holder.local, "n", 0) + 1
    return holder.local.n

class Seen(threading.local):
    n = 0
seen, counts = Seen(), []
def on_done(_fut):
    if threading.current_thread() is not threading.main_thread():
        seen.n += 1
        counts.append(seen.n)
'''


def test_rpc_threads_keep_their_python_state_between_calls(shell):
    """torch's RPC threads keep one Python thread state (and so their thread-locals) from
    call to call, on the callee and on the caller's callback threads: a fresh state per call
    was most of nbdist's per-call cost (bench/rpc/rpc.py)."""
    assert shell.run_cell(KEEP).success
    seen_by_callee = ev(shell, "[rpc.rpc_sync('obs1', bump_local) for _ in range(64)]")
    assert max(seen_by_callee) > 1, seen_by_callee  # 64 calls on at most 16 threads
    assert shell.run_cell("for _ in range(64):\n"
                          "    fu = rpc.rpc_async('obs2', f, args=(1,))\n"
                          "    fu.add_done_callback(on_done)\n"
                          "    fu.wait()\n").success
    counts = ev(shell, "counts")
    assert counts and max(counts) > 1, counts
