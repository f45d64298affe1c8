"""Behaviour 5: restart as often as you like, changing size and names: no hang, no leak."""

from __future__ import annotations

import gc
import threading

import psutil
import pytest

import nbdist
from nbdist.cluster import restart

SHAPES = [  # restarts keep unnamed settings, so each shape names what it needs
    "1 --name worker0 --worker-name worker{rank}",
    "3 --name agent --worker-name obs{rank}",
    "2 --name trainer --worker-name ps{rank}",
    "1 --name trainer --worker-name ps",
    "4 --name worker0 --worker-name worker{rank}",
    "2 --name agent --worker-name obs{rank}",
]

CHECK = '''
import torch, torch.distributed.rpc as rpc
names = [w.name for w in rpc._get_current_rpc_agent().get_worker_infos()]
last = sorted(names)[-1]
rref = rpc.remote(last, Holder, args=(len(names),))
__check = (rpc.rpc_sync(last, lambda x: x + 1, args=(1,)), rref.rpc_sync().get(),
           rref.to_here().v, len(names))
'''


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~30 s on a quiet 2-core machine; generous for a loaded one
def test_fifty_restarts_in_a_row(ipython):
    ipython.run_cell("class Holder:\n    def __init__(self, v):\n        self.v = v\n"
                     "    def get(self):\n        return self.v\n")
    proc = psutil.Process()
    baseline: dict = {}
    for i in range(50):
        shape = SHAPES[i % len(SHAPES)]
        if i == 0:
            ipython.run_line_magic("dist_start", shape)
        elif i % 3 == 0:
            ipython.run_line_magic("dist_stop", "")
            ipython.run_line_magic("dist_start", shape)
        else:
            ipython.run_line_magic("dist_restart", shape)
        c = nbdist.current()
        assert c is not None and c.world_size == int(shape.split()[0]) + 1
        res = ipython.run_cell(CHECK)  # RRefs of the previous world are dropped here too
        assert res.success, res.error_in_exec
        two, got, v, n = ipython.user_ns["__check"]
        assert (two, got, v, n) == (2, c.world_size, c.world_size, c.world_size)
        out = c.run("import os\nint(os.environ['NBDIST_RANK'])", show=False)
        assert out == {r: str(r) for r in range(1, c.world_size)}
        if i == 7:  # same shape as the last iteration (49 % 6 == 7 % 6)
            gc.collect()
            baseline = {"threads": threading.active_count(), "fds": proc.num_fds(),
                        "os_threads": proc.num_threads(), "rss": proc.memory_info().rss}
    gc.collect()
    ipython.run_cell("del rref")  # an RRef of a larger, gone world: dropped without a crash
    # the notebook process does not accumulate threads, descriptors or much memory
    assert threading.active_count() <= baseline["threads"] + 2
    assert proc.num_fds() <= baseline["fds"] + 8
    assert proc.num_threads() <= baseline["os_threads"] + 4  # old agents' pools are gone
    assert proc.memory_info().rss < baseline["rss"] + 300 * 2**20


def test_dist_restart_after_dist_stop_keeps_every_flag(ipython):
    """The README promises that flags not given keep their values: after `%dist_stop` too,
    the host flags included (the magic once rebuilt the spec from six of its fields)."""
    from dataclasses import replace

    ipython.run_line_magic(
        "dist_start", "1 --name agent --worker-name obs{rank} --threads 1 --rpc-timeout 30 "
        "--start-timeout 50 --iface lo --launcher 'ip netns exec {host} {command}' "
        "--remote-python /usr/bin/python3")
    spec = nbdist.current().spec
    assert (spec.iface, spec.launcher, spec.remote_python) == (
        "lo", "ip netns exec {host} {command}", "/usr/bin/python3")
    ipython.run_line_magic("dist_stop", "")
    ipython.run_line_magic("dist_restart", "")
    assert nbdist.current().spec == spec
    assert nbdist.current().names == ["agent", "obs1"]
    ipython.run_line_magic("dist_stop", "")
    ipython.run_line_magic("dist_restart", "2 --threads 2")
    assert nbdist.current().spec == replace(spec, n=2, threads=2)


# -- the handle a user holds (issue 30) -------------------------------------------------------
SCRIPT = r"""
import nbdist
from nbdist.cluster import restart
c = nbdist.start(2, quiet=True)
pids = [c.worker_pids()]
for _ in range(3):  # the second call used to fail: "RPC is already initialized"
    assert c.restart(quiet=True) is c
    pids.append(c.worker_pids())
assert nbdist.current() is c
print("RESULT", c.run("6 * 7", show=False), len({p for ps in pids for p in ps}))
c.stop()
"""


def test_restarting_the_same_handle_in_a_plain_script():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT {1: '42', 2: '42'} 8" in out.stdout, out.stdout  # 4 worlds, fresh workers


def test_a_restarted_handle_is_the_current_world(world):
    c = world(1)
    old = c.worker_pids()
    c2 = c.restart(2, quiet=True)
    assert c2 is c and nbdist.current() is c and c.running and c.world_size == 3
    assert set(c.worker_pids()).isdisjoint(old)
    c.stop()
    assert nbdist.current() is None
    assert c.restart(quiet=True) is c and c.running  # after a stop too
    assert c.run("1 + 1", show=False) == {1: "2", 2: "2"}


def test_a_second_world_is_refused_in_nbdists_words(world):
    c = world(1)
    c.stop()
    other = restart(quiet=True)  # the module's restart after a stop: a new handle
    try:
        assert other is not c and nbdist.current() is other
        for attempt in (lambda: c.restart(quiet=True), lambda: nbdist.start(1, quiet=True),
                        lambda: c.run("1", show=False)):
            with pytest.raises(nbdist.ClusterStateError) as info:
                attempt()
            assert "nbdist.current()" in str(info.value)
            assert "RPC is already initialized" not in str(info.value)
        with pytest.raises(nbdist.ClusterStateError, match="a world is already running"):
            c.restart(quiet=True)
        assert other.running and other.run("3", show=False) == {1: "3"}
    finally:
        other.stop()
