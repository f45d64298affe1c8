"""A world of 3 fake hosts × 4 ranks (network namespaces, tests/fakehosts.py): the CPU % and
memory of ranks on other hosts in ``%dist_status`` (sampled by each host's join agent), and
equal lines of its 12 remote ranks shown once. Skipped, with the reason, where namespaces
cannot be made (not root, no iproute2)."""

from __future__ import annotations

import os
import time

import psutil
import pytest
import torch.distributed.rpc as rpc
from conftest import wait_until
from fakehosts import FakeHosts, can_make_namespaces

import nbdist
from nbdist.output.router import Router

WHY = can_make_namespaces()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=f"fake hosts: {WHY}")]


@pytest.fixture(scope="module")
def world():
    fh = FakeHosts(["a", "b", "c"])
    try:
        c = nbdist.start(0, hosts={fh.ns[h]: 4 for h in ("a", "b", "c")}, iface=fh.address,
                         launcher=fh.launcher, quiet=True)
        try:
            c.run("print('up')", show=False)
            c.flush()
            yield fh, c
        finally:
            c.stop()
    finally:
        nbdist.release_hosts()
        fh.close()


def spin(seconds: float) -> int:
    """Keeps one core busy on the rank that runs it."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return os.getpid()


def _rows(c) -> dict:
    return {row["rank"]: row for row in c.status().rows}


def test_status_shows_cpu_and_memory_of_ranks_on_other_hosts(world):
    fh, c = world
    remote = range(1, 13)
    assert all(c.ranks[r].host for r in remote)
    rows = wait_until(lambda: (lambda rs: rs if all(rs[r]["mem_mb"] for r in remote)
                               else None)(_rows(c)), 10, "every remote rank's memory")
    for r in remote:  # fake hosts share this machine's pids: the figure is the rank's own
        rss = psutil.Process(c.ranks[r].pid).memory_info().rss / 2**20
        assert 30 < rows[r]["mem_mb"] < 4000 and abs(rows[r]["mem_mb"] - rss) < 0.2 * rss
        assert rows[r]["cpu"] is not None

    def busiest_on_its_host() -> bool:
        rs = _rows(c)
        peers = [rs[r]["cpu"] or 0 for r in (5, 7, 8)]  # host b's other ranks, idle
        return (rs[6]["cpu"] or 0) > max(peers)

    fut = rpc.rpc_async(c.names[6], spin, args=(6.0,))
    try:  # on a loaded machine a spinning rank may get little CPU, but more than idle ones
        wait_until(busiest_on_its_host, 10, "rank 6's CPU above its idle peers'")
    finally:
        assert fut.wait() == c.ranks[6].pid
    table = str(c.status())
    line = next(ln for ln in table.splitlines() if ln.split()[:2] == ["6", c.names[6]])
    assert fh.ns["b"] in line and " - " not in line.split(fh.ns["b"], 1)[1], table


def test_equal_lines_of_twelve_remote_ranks_show_once(world, monkeypatch):
    fh, c = world
    assert c.router.aggregate  # 12 workers: on by default
    written: list[str] = []
    monkeypatch.setattr(Router, "write", staticmethod(lambda stream, text: written.append(text)))
    at = time.time() + 1.0
    c.run(f"import time\ntime.sleep(max(0, {at} - time.time()))\nprint('epoch 3 done')\n",
          show=False)
    lines = "".join(written).splitlines()
    assert "[worker1-12] epoch 3 done" in lines, lines
    assert sum("epoch 3 done" in ln for ln in lines) == 1
    for r in range(1, 13):
        assert c.logs(r, tail=1) == ["epoch 3 done"]
