"""``--ray`` on a real Ray 2.60 cluster (``tests/raybed.py``: the head on this machine, where
the notebook's driver runs, worker nodes in network namespaces): the notebook asks Ray for a
placement group, its bundles' ranks join the world, restarts keep the group, a dead node is
named in Ray's words and healed, and nothing of it outlives a stop or a SIGKILLed kernel.

One cluster for the whole module (3 nodes of 4 CPUs: a spare for a bundle whose node died),
started once and stopped at the end even on failure. Skipped, with the reason, where the test
bed cannot start (not root, no ray)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
from conftest import notebook_process, wait_until
from raybed import RayBed, cannot_run, leftovers

import nbdist
from nbdist.errors import DistTimeoutError

# Ray's driver keeps about a dozen handles (event loops, a socket, its log file) from its first
# connection to the process's end, and opens them anew at each connection (measured: 6 fds
# before, 17 after each of 3 connect-and-shutdown cycles): new numbers, the same count
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.fd_slack(16),
              pytest.mark.skipif(cannot_run() is not None, reason=str(cannot_run()))]

GONE = 30.0  # seconds for Ray to remove what a stopped or killed notebook held
START = 120.0  # seconds for a notebook process to get its group and start a world on it
TWO_BY_TWO = "--nodes 2 --ranks-per-node 2 --cpus 4 --strategy STRICT_SPREAD"


@pytest.fixture(scope="module")
def bed():
    cluster = RayBed(nodes=3, cpus=4)
    before = os.environ.get("RAY_ADDRESS")
    try:
        cluster.up()
        os.environ.update(cluster.env)
        _warm_ray()
        yield cluster
    finally:
        try:
            nbdist.stop()
            nbdist.release_hosts()
        finally:
            cluster.down()
            if before is None:
                os.environ.pop("RAY_ADDRESS", None)
            else:
                os.environ["RAY_ADDRESS"] = before


def _warm_ray() -> None:
    """Connect to the bed once and leave, so the handles Ray's driver keeps (above) exist
    before the first test."""
    import logging

    import ray

    ray.init(log_to_driver=False, logging_level=logging.ERROR)
    ray.shutdown()


def _nothing_left(bed) -> bool:
    actors, groups = leftovers(bed.address)
    return not actors and not groups


@pytest.fixture
def released(bed):
    """Every test ends with no actor or placement group of it left in Ray."""
    yield
    nbdist.stop()
    nbdist.release_hosts()
    wait_until(lambda: _nothing_left(bed), GONE, "Ray to list no actor and no placement group")


def _group() -> str:
    from nbdist.cluster.session import session

    assert session().allocation is not None
    return str(session().allocation.job_id)


def where():
    import os
    import socket

    import torch

    return {"host": socket.gethostname(), "local": os.environ.get("LOCAL_RANK"),
            "omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads()}


def test_two_nodes_of_two_ranks_with_their_cpus_restart_in_the_group_and_give_it_back(
        bed, released, capfd):
    import torch.distributed.rpc as rpc

    c = nbdist.start(0, ray=TWO_BY_TWO, quiet=True)
    group = _group()
    assert f"Ray placement group {group} RUNNING on bundle0, bundle1" in capfd.readouterr().err
    seen = {r: rpc.rpc_sync(c.names[r], where) for r in range(1, 5)}
    hosts = [seen[r]["host"] for r in range(1, 5)]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    assert set(hosts) <= {"nbray1", "nbray2", "nbray3"}
    for r, local in zip(range(1, 5), (0, 1, 0, 1), strict=True):
        assert seen[r]["local"] == str(local)
        assert seen[r]["omp"] == "2" and seen[r]["threads"] == 2  # 4 CPUs over 2 ranks
    c.run("import socket; print('on', socket.gethostname())")
    out = capfd.readouterr().out
    assert f"[worker1] on {hosts[0]}" in out and f"[worker4] on {hosts[2]}" in out
    status = str(c.hosts_status())
    ids = bed.node_ids()
    assert f"Ray placement group {group}: RUNNING" in status
    for host in (hosts[0], hosts[2]):  # each bundle's Ray node id, as Ray names it
        assert ids[host][:12] in status, (host, status)
    # restart and keep-restart in the same group; a kept rank keeps its variables
    c = c.restart(quiet=True)
    assert _group() == group
    c.run("x = 41", show=False)
    c = c.restart(keep=True, quiet=True)
    assert _group() == group and c.run("x + 1", ranks=[3], show=False) == {3: "42"}
    # a stop keeps the group and its agents warm; release gives them back
    c.stop()
    actors, groups = leftovers(bed.address)
    assert len(groups) == 1 and len(actors) == 2, (actors, groups)
    c = c.restart(quiet=True)
    assert _group() == group and c.running
    c.stop()
    assert nbdist.release_hosts() == 2
    wait_until(lambda: _nothing_left(bed), GONE, "Ray to list nothing after release_hosts()")


def test_a_gloo_group_spans_the_notebook_and_the_bundles(bed, released):
    import threading

    import torch
    import torch.distributed as dist

    c = nbdist.start(0, ray="--nodes 2 --ranks-per-node 1 --cpus 1 --strategy PACK",
                     process_group="gloo", quiet=True)
    assert c.run("import torch.distributed as dist; (dist.get_world_size(), dist.get_backend())",
                 ranks=[1, 2], show=False) == {1: "(3, 'gloo')", 2: "(3, 'gloo')"}
    mine = torch.ones(1)
    here = threading.Thread(target=dist.all_reduce, args=(mine,))  # rank 0's part
    here.start()
    got = c.run("import torch; t = torch.ones(1); dist.all_reduce(t); t.item()", show=False)
    here.join(30)
    assert got == {1: "3.0", 2: "3.0"} and mine.item() == 3.0


def test_new_options_on_a_restart_ask_for_a_new_group_and_none_gives_it_back(bed, released):
    c = nbdist.start(0, ray=TWO_BY_TWO, quiet=True)
    first = _group()
    c = c.restart(ray="--nodes 1 --ranks-per-node 1 --cpus 1", quiet=True)
    assert _group() != first and c.world_size == 2
    assert c.run("import socket; socket.gethostname()", ranks=[1], show=False)[1].startswith(
        "'nbray")
    actors, groups = leftovers(bed.address)  # the first group and its actors are gone
    assert len(groups) == 1 and groups[0]["id"].startswith(_group()), groups
    assert len(actors) == 1, actors
    c = c.restart(1, ray="none", quiet=True)  # back to this machine only
    assert c.spec.ray is None and c.world_size == 2
    wait_until(lambda: _nothing_left(bed), GONE, "Ray to list nothing after --ray none")


def test_a_dead_node_is_named_in_rays_words_at_once_and_healed(bed, released, capfd):
    import torch.distributed.rpc as rpc

    c = nbdist.start(0, ray=TWO_BY_TWO, heal=True, quiet=True)
    before = {r: rpc.rpc_sync(c.names[r], where)["host"] for r in range(1, 5)}
    victim = before[1]  # bundle0's node
    capfd.readouterr()
    t0 = time.monotonic()
    bed.kill_raylet(int(victim.removeprefix("nbray")))
    said: list[str] = []

    def named() -> bool:
        said.append(capfd.readouterr().err)
        return re.search(r"host bundle0 lost \(Ray node \w+ \([\d.]+\) is dead: ",
                         "".join(said)) is not None

    wait_until(named, 10.0, "the lost host named with Ray's reason", interval=0.05)
    seconds = time.monotonic() - t0
    print(f"host lost, named in Ray's words {seconds:.2f}s after the raylet's SIGKILL")
    text = "".join(said)
    assert "worker1, worker2" in text or "ranks 1, 2" in text or "ranks 1-2" in text, text
    assert seconds < 2.0 + 1.0, f"named after {seconds:.1f}s: {text}"  # 2 s, and a margin
    # --heal: Ray places bundle0 again on the spare node, and its ranks come back there
    wait_until(lambda: c.running and all(i.alive for i in c.ranks.values()), 90.0,
               "the world to be healed")
    after = {r: rpc.rpc_sync(c.names[r], where)["host"] for r in range(1, 5)}
    assert after[1] == after[2] and after[1] not in (victim, before[3]), (before, after)
    assert after[3] == before[3] and after[4] == before[4]


def test_pending_then_the_start_timeout_removes_the_group(bed, released, capfd):
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=r"still INFEASIBLE.* after \ds "
                                               r"\(--start-timeout\); it was removed"):
        nbdist.start(0, ray="--nodes 2 --cpus 64", start_timeout=4, quiet=True)
    assert time.monotonic() - t0 < 30
    err = capfd.readouterr().err
    assert re.search(r"Ray placement group \w+ PENDING \(INFEASIBLE: no node of the cluster "
                     r"has a bundle's resources", err), err
    assert "cancelled" in err
    wait_until(lambda: _nothing_left(bed), GONE, "the pending group to be removed")


def test_a_killed_notebook_leaves_no_actor_and_no_group(bed, tmp_path):
    with notebook_process(tmp_path, f"nbdist.start(0, ray={TWO_BY_TWO!r}, quiet=True)",
                          START) as (proc, _group_id):
        actors, groups = leftovers(bed.address)
        assert len(groups) == 1 and len(actors) == 2, (actors, groups)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        wait_until(lambda: _nothing_left(bed), GONE, "Ray to remove the killed notebook's "
                                                     "actors and placement group")
        print(f"nothing left {time.monotonic() - t0:.1f}s after the SIGKILL")
        wait_until(lambda: not _agents_on_nodes(), GONE, "the nodes' agents and ranks to end")


def _agents_on_nodes() -> list[str]:
    """Join agents and ranks still running (their command lines)."""
    out = subprocess.run(["pgrep", "-af", "nbdist.join"], capture_output=True,
                         text=True, timeout=10).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]
