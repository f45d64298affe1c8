"""Issue 41, item 3: a cell with its own ``init_rpc`` ... ``shutdown`` runs again and again.

torch keeps the RRef context of a shut-down agent (destroyed, holding that agent), so a second
run in one process hangs in ``shutdown`` ("Timed out waiting for pending OwnerRRefs to be
deleted"). A script never meets this: each run is a fresh process. In a world (and in a kernel
with no world) the second, fifth run passes on every rank, the notebook included, and a run
that fails leaves the next one working. Real kernels, real worlds, torch's own RPC.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import free_port

pytestmark = [pytest.mark.timeout(300)]

# the script form of an RPC program: its own init_rpc (env://, as torchrun sets it) and shutdown
RUN = """%%dist --local
import os, torch, torch.distributed.rpc as rpc
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=n)
peer = f"worker{(rank + 1) % n}"
r = rpc.remote(peer, torch.add, args=(torch.ones(2), rank))
s = rpc.rpc_sync(peer, torch.mul, args=(r.to_here(), 2))
held = rpc.remote(peer, torch.neg, args=(torch.ones(3),))  # still held at shutdown, as tests do
FAIL
print("run", RUN_ID, "rank", rank, s.tolist())
rpc.shutdown()
"""


def _run(kernel, run_id: int, fail: str = "") -> object:
    code = RUN.replace("RUN_ID", str(run_id)).replace("FAIL", fail)
    return kernel.execute(code, timeout=90)


def test_a_script_form_cell_runs_five_times_on_every_rank(kernel):
    kernel.execute("%load_ext nbdist")
    rep = kernel.execute("%dist_start 2 --no-rpc --worker-name obs{rank}", timeout=120)
    assert rep.status == "ok", rep.stderr
    try:
        for run_id in range(5):
            rep = _run(kernel, run_id)
            assert rep.status == "ok", (run_id, rep.stdout, rep.stderr, rep.error)
            assert f"run {run_id} rank 0 [2.0, 2.0]" in rep.stdout
            assert f"[obs1] run {run_id} rank 1 [4.0, 4.0]" in rep.stdout
            assert f"[obs2] run {run_id} rank 2 [6.0, 6.0]" in rep.stdout
    finally:
        kernel.execute("%dist_stop", timeout=60)


def test_a_run_that_fails_leaves_the_next_one_working(kernel):
    kernel.execute("%load_ext nbdist")
    rep = kernel.execute("%dist_start 2 --no-rpc", timeout=120)
    assert rep.status == "ok", rep.stderr
    try:
        # a worker fails (as torch's tests fail: an assertion between init_rpc and shutdown)
        rep = _run(kernel, 0, fail="assert rank != 1, 'rank 1 fails'")
        assert rep.error is not None and "rank 1 fails" in rep.error["evalue"]
        # every rank's agent went with the failed cell, as each script process would have
        said = rep.stdout + rep.stderr
        assert "its init_rpc started still up; it was shut down here" in said
        for run_id in (1, 2):
            rep = _run(kernel, run_id)
            assert rep.status == "ok", (run_id, rep.stdout, rep.stderr, rep.error)
            assert rep.stdout.count(f"run {run_id} rank") == 3
        # a cell that succeeds leaves the agent it started up, for the cells after it
        rep = kernel.execute(RUN.replace("FAIL", "").replace("rpc.shutdown()\n", "")
                             .replace("RUN_ID", "3"), timeout=90)
        assert rep.status == "ok", rep.stderr
        rep = kernel.execute("%%dist --local\nprint('still up', rpc.is_available() and "
                             "rpc.get_worker_info().name)\nrpc.shutdown()", timeout=90)
        assert rep.status == "ok", rep.stderr
        assert rep.stdout.count("still up worker") == 3
    finally:
        kernel.execute("%dist_stop", timeout=60)


def test_a_kernel_without_a_world_runs_it_twice(kernel):
    kernel.execute("%load_ext nbdist")
    code = ("import os, torch, torch.distributed.rpc as rpc\n"
            "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(THEPORT))\n"
            "rpc.init_rpc('solo', rank=0, world_size=1)\n"
            "r = rpc.remote('solo', torch.add, args=(torch.ones(2), 1))\n"
            "print('solo', r.to_here().tolist())\n"
            "rpc.shutdown()")
    from conftest import free_port

    for _ in range(3):
        rep = kernel.execute(code.replace("THEPORT", str(free_port())), timeout=60)
        assert rep.status == "ok", (rep.stdout, rep.stderr, rep.error)
        assert "solo [2.0, 2.0]" in rep.stdout


# a run that leaves what a process's end would clear: an autograd context made and never
# released (torch's test_clean_context_during_backward exits inside it), and an RRef context
# that, after shutdown, still makes RRefs with no agent (torch keeps that within a run; a
# fresh process, the next run of a script, raises "Current RPC agent is not set")
LEFTOVERS = """import os, torch
import torch.distributed.rpc as rpc, torch.distributed.autograd as da
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
def rref_without_agent():
    try:
        rpc.RRef(torch.ones(1))
        return "an RRef"
    except RuntimeError as exc:
        return str(exc).split("!")[0]
said = f"{rank} before: {rref_without_agent()}"
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=n)
with da.context() as ctx:
    said += ", context ok"
kept = da._new_context()  # current on this thread from here on, never released
rpc.shutdown()
print(f"{said}, after: {rref_without_agent()}")
"""


def test_a_run_that_leaves_an_autograd_context_and_an_rref_runs_as_in_a_fresh_process(
        kernel, tmp_path):
    script = tmp_path / "leftovers.py"
    script.write_text("import os\nos.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR="
                      "'127.0.0.1', MASTER_PORT=os.environ['PORT'])\n" + LEFTOVERS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PORT": str(free_port())})
    assert done.returncode == 0, done.stderr[-2000:]
    expected = "before: Current RPC agent is not set, context ok, after: an RRef"
    assert f"0 {expected}" in done.stdout, done.stdout  # the script: a fresh process a run
    kernel.execute("%load_ext nbdist")
    rep = kernel.execute("%dist_start 1 --no-rpc", timeout=120)
    assert rep.status == "ok", rep.stderr
    try:
        for _ in range(3):
            rep = kernel.execute("%%dist --local\n" + LEFTOVERS, timeout=90)
            assert rep.status == "ok", (rep.stdout, rep.stderr, rep.error)
            assert f"0 {expected}" in rep.stdout and \
                f"[worker1] 1 {expected}" in rep.stdout, rep.stdout
    finally:
        kernel.execute("%dist_stop", timeout=60)


def test_a_run_that_leaves_its_agent_up_runs_again(kernel):
    """A script that ends without ``rpc.shutdown()`` (torch's tests with their own init_rpc
    do) runs again in a fresh process; the cell runs again too: the agent the earlier run left
    is shut down first, and nbdist says so. torch alone: "RPC is already initialized"."""
    kernel.execute("%load_ext nbdist")
    rep = kernel.execute("%dist_start 2 --no-rpc", timeout=120)
    assert rep.status == "ok", rep.stderr
    left_up = RUN.replace("FAIL", "").replace("rpc.shutdown()\n", "")
    try:
        for run_id in range(3):
            rep = kernel.execute(left_up.replace("RUN_ID", str(run_id)), timeout=90)
            assert rep.status == "ok", (run_id, rep.stdout, rep.stderr, rep.error)
            assert rep.stdout.count(f"run {run_id} rank") == 3, rep.stdout
            said = (rep.stdout + rep.stderr).count("an earlier cell's init_rpc started was "
                                                   "still up")
            assert said == (3 if run_id else 0), (run_id, rep.stdout, rep.stderr)
        rep = kernel.execute("%%dist --local\nrpc.shutdown()\nprint('down')", timeout=90)
        assert rep.status == "ok" and rep.stdout.count("down") == 3, rep.stdout
    finally:
        kernel.execute("%dist_stop", timeout=60)


def test_after_a_world_grows_the_run_meets_on_kept_and_new_ranks(kernel):
    """A kept rank has counted every ``init_rpc`` and every graceful ``shutdown`` before; a
    rank the ``--keep`` restart added has counted none. torch names its rendezvous keys and
    its shutdown barrier's keys from those counts, so the run after growing hung in
    ``init_rpc`` (kept ranks at ``rpc_prefix_1``, the new one at ``rpc_prefix_0``) and then,
    with those aligned, in ``shutdown`` ("Wait timeout": the barrier's keys). As a script,
    every process is new and counts from 0."""
    kernel.execute("%load_ext nbdist")
    rep = kernel.execute("%dist_start 2 --no-rpc", timeout=120)
    assert rep.status == "ok", rep.stderr
    try:
        rep = _run(kernel, 0)
        assert rep.status == "ok", (rep.stdout, rep.stderr, rep.error)
        rep = kernel.execute("%dist_restart 3 --keep", timeout=120)
        assert rep.status == "ok" and "fresh: 3 (new)" in rep.stdout, rep.stdout + rep.stderr
        for run_id in (1, 2):
            rep = _run(kernel, run_id)
            assert rep.status == "ok", (run_id, rep.stdout, rep.stderr, rep.error)
            assert f"run {run_id} rank 0 [2.0, 2.0]" in rep.stdout, rep.stdout
            assert f"[worker3] run {run_id} rank 3 [8.0, 8.0]" in rep.stdout, rep.stdout
    finally:
        kernel.execute("%dist_stop", timeout=60)


# a run that registers its own RPC backend (torch's TensorPipe handlers under another name)
OWN_BACKEND = """%%dist --local
import os, torch, torch.distributed.rpc as rpc
from torch.distributed.rpc import backend_registry as registry
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
tp = registry.BackendType.TENSORPIPE.value
backend = registry.register_backend("MINE", tp.construct_rpc_backend_options_handler,
                                    tp.init_backend_handler)
rpc.init_rpc(f"worker{rank}", backend=backend, rank=rank, world_size=n)
print("own backend", rank, rpc.rpc_sync(f"worker{(rank + 1) % n}", torch.add, args=(rank, 1)))
rpc.shutdown()
"""
TENSORPIPE_BY_NAME = RUN.replace(
    'rpc.init_rpc(f"worker{rank}", rank=rank, world_size=n)',
    'rpc.init_rpc(f"worker{rank}", backend=rpc.BackendType.TENSORPIPE, rank=rank, '
    'world_size=n)').replace("FAIL", "")


def test_a_backend_an_earlier_run_registered_is_gone_in_the_next(kernel):
    """A script's next run is a fresh process: it registers its backend again ("already
    registered" in one process), and ``rpc.BackendType.TENSORPIPE`` is still a backend
    (after ``register_backend`` rebinds the enum, torch refuses the old one's members)."""
    kernel.execute("%load_ext nbdist")
    rep = kernel.execute("%dist_start 1 --no-rpc", timeout=120)
    assert rep.status == "ok", rep.stderr
    try:
        for _ in range(2):
            rep = kernel.execute(OWN_BACKEND, timeout=90)
            assert rep.status == "ok", (rep.stdout, rep.stderr, rep.error)
            assert rep.stdout.count("own backend") == 2
        rep = kernel.execute(TENSORPIPE_BY_NAME.replace("RUN_ID", "9"), timeout=90)
        assert rep.status == "ok", (rep.stdout, rep.stderr, rep.error)
        assert rep.stdout.count("run 9 rank") == 2
    finally:
        kernel.execute("%dist_stop", timeout=60)
