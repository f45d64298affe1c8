"""A world needs open files in the notebook's process (rank 0 keeps some per peer): a soft
limit lower than that is raised within the hard one, and a hard limit too low is a clear
error before anything starts, leaving nothing running. Each case a fresh Python whose
limits are set before ``import nbdist``, a 16-rank world over TCP (rank 0 opens about 270
files; ``nbdist/open_files.py`` has the figures)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from nbdist import open_files

CHILD = r"""
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
import nbdist
out = {}
try:
    c = nbdist.start(15, quiet=True, rpc_transport="tcp")
    out["answered"] = len(c[:].call(os.getpid))
    out["soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    out["open"] = len(os.listdir("/proc/self/fd"))
    nbdist.stop()
except ValueError as exc:
    out["error"] = str(exc)
me = str(os.getpid())
out["children"] = [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(
    f"/proc/{p}/stat") and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == me]
print("RESULT " + json.dumps(out), flush=True)
"""


def _child(soft: int, hard: int) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(soft), str(hard)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])


def _hard() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def test_the_need_grows_per_peer_and_more_over_shared_memory():
    assert open_files.needed(1, shm=True) == open_files.BASE
    assert open_files.needed(16, shm=True) - open_files.needed(15, shm=True) \
        == open_files.PER_PEER["shm"]
    assert open_files.needed(257, shm=False) == open_files.BASE + 256 * open_files.PER_PEER["tcp"]
    assert open_files.needed(16, shm=True) > open_files.needed(16, shm=False)


# a fresh Python and a 16-rank world: ~10 s
@pytest.mark.skipif(_hard() != resource.RLIM_INFINITY and _hard() < 1024,
                    reason="the hard limit on open files leaves no room to raise the soft one")
def test_a_soft_limit_below_the_worlds_need_is_raised_and_the_world_starts():
    out = _child(200, _hard())  # rank 0 of 16 ranks opens ~270: torch fails at 200 without it
    assert "error" not in out, out["error"]
    assert out["answered"] == 15
    assert out["soft"] == open_files.needed(16, shm=False) > out["open"] > 200, out


# a fresh Python: ~3 s
def test_a_hard_limit_below_the_worlds_need_is_a_clear_error_and_starts_nothing():
    out = _child(200, 300)
    assert out.get("error", "").startswith(
        "a world of 16 ranks needs about 466 open files in this process"), out
    assert "at most 300" in out["error"] and "start at most 3 workers" in out["error"], out
    assert out["children"] == [], out


BUSY_CHILD = r"""
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # a notebook with many files
import nbdist
out = {}
c = nbdist.start(2, quiet=True, start_timeout=60)
try:
    out["channels"] = sorted(i.channel.fileno() for r, i in c.ranks.items() if r)
    out["cell"] = c.run("print('heard')\n6 * 7", show=False, timeout=30)
    out["view"] = c[:].call(os.getpid)
    out["pids"] = {str(r): i.pid for r, i in c.ranks.items() if r}
finally:
    nbdist.stop()
print("RESULT " + json.dumps(out, default=str), flush=True)
"""


# a fresh Python and a 3-rank world: ~5 s
@pytest.mark.skipif(_hard() != resource.RLIM_INFINITY and _hard() < 4096,
                    reason="the hard limit on open files leaves no room for 1,100 more")
def test_control_channels_numbered_past_1024_are_heard():
    """select() refuses a descriptor of 1024 or more: a notebook holding many files (or a
    big world's rank 0, healing a rank) accepts control channels numbered past it, and the
    receiver, which waited on them with select(), heard no rank (``nbdist/fd_wait.py``)."""
    proc = subprocess.run([sys.executable, "-c", BUSY_CHILD],
                          capture_output=True, text=True, timeout=180, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert min(out["channels"]) > 1024, out
    assert out["cell"] == {"1": "42", "2": "42"}, out
    assert {str(k): v for k, v in out["view"].items()} == out["pids"], out
