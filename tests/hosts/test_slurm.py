"""``--slurm`` on a real SLURM 22.05 cluster (``../shared/slurm``: slurmctld here, one slurmd
per node in a network namespace): the notebook, outside any allocation, asks for its nodes,
keeps them across restarts, gives them back, and explains their end.

One cluster shape for the whole module (3 nodes, ``task/affinity``, 2 fake GPUs per node):
``up.sh`` once, ``down.sh`` at the end even on failure. Skipped, with the reason, where the
test bed cannot start (not root, no ../shared/slurm, no apt)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import pytest
from conftest import notebook_process, wait_until
from slurmbed import IFACE, SlurmBed, cannot_run, jobs

import nbdist
from nbdist.errors import DistTimeoutError, StartError, WorkerDiedError

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(cannot_run() is not None, reason=str(cannot_run()))]

GONE = 20.0  # seconds for slurmctld to forget a cancelled job (KillWait 5 s, completing)
START = 120.0  # seconds for a notebook process to get its allocation and start a world on it


@pytest.fixture(scope="module")
def bed():
    cluster = SlurmBed(nodes=3, task="task/affinity", gpus=2)
    try:
        cluster.up()
        yield cluster
    finally:
        try:
            nbdist.stop()
            nbdist.release_hosts()
        finally:
            cluster.down()


@pytest.fixture
def released(bed):
    """Every test ends with nothing of it in SLURM's queue."""
    yield
    nbdist.stop()
    nbdist.release_hosts()
    wait_until(lambda: not jobs(), GONE, "squeue to be empty")


def _job() -> str:
    from nbdist.cluster.session import session

    assert session().allocation is not None
    return str(session().allocation.job_id)


def _wait_said(capfd, text: str | re.Pattern, timeout: float) -> None:
    """Wait until ``text`` (or a match of the pattern) was written to stderr (what was read
    before is kept)."""
    seen: list[str] = []

    def said() -> bool:
        seen.append(capfd.readouterr().err)
        if isinstance(text, re.Pattern):
            return text.search("".join(seen)) is not None
        return text in "".join(seen)

    try:
        wait_until(said, timeout, f"stderr to say {text!r}", interval=0.2)
    except AssertionError:
        raise AssertionError(f"stderr never said {text!r}; it said:\n{''.join(seen)}") from None


def where():
    """Where a rank runs and what share of its node it was given."""
    import socket

    import torch
    return {"host": socket.gethostname(), "local": os.environ.get("LOCAL_RANK"),
            "device": os.environ.get("NBDIST_DEVICE"),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
            "cpus": sorted(os.sched_getaffinity(0))}


def test_a_notebook_outside_any_allocation_gets_two_nodes_keeps_them_and_gives_them_back(
        released, capfd):
    import torch.distributed.rpc as rpc

    c = nbdist.start(0, slurm="-N 2 --ntasks-per-node=2 --gpus-per-node=2 -t 10",
                     iface=IFACE, process_group="auto", quiet=True)
    job = _job()
    err = capfd.readouterr().err
    assert f"SLURM job {job} RUNNING on nbnode1, nbnode2" in err
    assert "left (time limit" not in err  # 10 minutes: no warning before 5 are left
    # every rank on its node, with its share: 1 of the node's 2 CPUs, its own fake GPU
    seen = {r: rpc.rpc_sync(c.names[r], where) for r in range(1, 5)}
    assert [seen[r]["host"] for r in range(1, 5)] == ["nbnode1", "nbnode1", "nbnode2",
                                                       "nbnode2"]
    for r, local in zip(range(1, 5), (0, 1, 0, 1), strict=True):
        assert seen[r]["local"] == str(local)
        assert seen[r]["device"] == f"cuda:{local}" and seen[r]["visible"] == "0,1"
        assert seen[r]["omp"] == "1" and seen[r]["threads"] == 1
        assert seen[r]["cpus"] == [local]  # task/affinity: the step's CPUs, split
    assert c._world.gpu.backend == "gloo"  # no CUDA in the notebook: auto is gloo
    c.run("import socket; print('on', socket.gethostname())")
    out = capfd.readouterr().out
    for r, host in ((1, "nbnode1"), (4, "nbnode2")):
        assert f"[worker{r}] on {host}" in out
    status = str(c.hosts_status())
    assert f"SLURM job {job}: RUNNING" in status and "left (time limit 00:10:00)" in status
    # the agents' steps overlap: the user's own srun in the job is not blocked
    own = subprocess.run(["srun", f"--jobid={job}", "-N1", "-n1", "--nodelist=nbnode1",
                          "hostname"], capture_output=True, text=True, timeout=30)
    assert own.stdout.strip() == "nbnode1", own.stderr
    # restart and keep-restart in the same job; a kept rank keeps its variables
    c = c.restart()
    assert _job() == job
    c.run("x = 41", show=False)
    c = c.restart(keep=True, quiet=True)
    assert _job() == job and c.run("x + 1", ranks=[3], show=False) == {3: "42"}
    # a stop keeps the job and its agents warm; release gives it back
    c.stop()
    assert jobs() == [job]
    c = c.restart(quiet=True)  # %dist_restart after %dist_stop: the same job again
    assert _job() == job and c.running
    c.stop()
    assert nbdist.release_hosts() == 2
    wait_until(lambda: not jobs(), GONE, "the job to end after release_hosts()")


def test_a_three_node_world(released, capfd):
    c = nbdist.start(1, slurm="-N3 --ntasks-per-node=2", iface=IFACE, quiet=True)
    assert [h for h, _ in c.spec.hosts] == ["nbnode1", "nbnode2", "nbnode3"]
    assert c.world_size == 8
    c.run("import socket; print('epoch 3 done on', socket.gethostname())")
    out = capfd.readouterr().out
    for r in range(2, 8):
        assert f"[worker{r}] epoch 3 done on nbnode{(r - 2) // 2 + 1}" in out


def test_a_killed_notebook_leaves_no_job(bed, tmp_path):
    with notebook_process(tmp_path, f"nbdist.start(0, slurm='-N2', iface={IFACE!r}, quiet=True)",
                          START) as (proc, job):
        assert jobs() == [job]
        proc.kill()
        proc.wait(10)
        wait_until(lambda: not jobs(), GONE, "the job to end after the notebook's SIGKILL")


@pytest.fixture
def full(bed):
    """The cluster full: a job holding every CPU of every node, cancelled after."""
    out = subprocess.run(["sbatch", "--parsable", "-N3", "-n6", "-o", "/dev/null", "--wrap",
                          "exec sleep infinity"], capture_output=True, text=True, timeout=30)
    blocker = out.stdout.strip()
    assert blocker.isdigit(), out.stderr
    wait_until(lambda: "RUNNING" in subprocess.run(
        ["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True).stdout,
        30.0, "the blocking job to run")
    yield blocker
    subprocess.run(["scancel", blocker], timeout=30)
    wait_until(lambda: not jobs(), GONE, "squeue to be empty")


def test_pending_then_the_start_timeout_or_ctrl_c_cancels_the_job(full, capfd, ctrl_c):
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=r"still PENDING \(\w+\) after \ds "
                                                 r"\(--start-timeout\); it was cancelled"):
        nbdist.start(0, slurm="-N2", iface=IFACE, start_timeout=5, quiet=True)
    assert time.monotonic() - t0 < 15
    assert re.search(r"SLURM job \d+ PENDING( \(Resources\))?, waited \d+s \(Ctrl-C cancels",
                     capfd.readouterr().err)  # the live line
    assert jobs() == [full]
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            nbdist.start(0, slurm="-N2", iface=IFACE, start_timeout=60, quiet=True)
    finally:
        timer.cancel()
    assert jobs() == [full]


def test_scancel_is_explained_and_restart_asks_again(released, capfd):
    c = nbdist.start(0, slurm="-N2", iface=IFACE, quiet=True)
    job = _job()
    subprocess.run(["scancel", job], check=True, timeout=30)
    said = (f"SLURM job {job} ended: CANCELLED (it was cancelled (scancel, or an "
            "administrator)): ranks 1, 2 on nbnode1, nbnode2 lost")
    _wait_said(capfd, said, 30.0)
    with pytest.raises(WorkerDiedError, match="CANCELLED"):
        c.run("1", show=False)
    c = c.restart()
    assert _job() != job and c.run("2", show=False) == {1: "2", 2: "2"}
    assert (f"SLURM job {job} ended: CANCELLED (it was cancelled (scancel, or an "
            "administrator)); asking for a new allocation with the same options"
            ) in capfd.readouterr().out


@pytest.mark.slow
def test_a_one_minute_time_limit_is_warned_and_explained(released, capfd):
    nbdist.start(0, slurm="-N1 -t 1", iface=IFACE, quiet=True)
    job = _job()
    # the warning comes at once, with what squeue says is left: a second may have passed
    _wait_said(capfd, re.compile(rf"SLURM job {job} has 0:0(1:00|0:5\d) left "
                                 r"\(time limit 00:01:00\)"), 10.0)
    _wait_said(capfd, f"SLURM job {job} ended: TIMEOUT (its time limit, 00:01:00, was "
                      "reached): rank 1 on nbnode1 lost", 150.0)


def test_what_sbatch_refuses_comes_back_verbatim_and_nothing_is_queued(released):
    with pytest.raises(ValueError, match="(?s)sbatch refused.*unrecognized option '--bogus'"):
        nbdist.start(0, slurm="-N1 --bogus", iface=IFACE, quiet=True)
    with pytest.raises(ValueError, match="invalid partition specified: nope"):
        nbdist.start(0, slurm="-N1 -p nope", iface=IFACE, quiet=True)
    with pytest.raises(StartError, match="can never start.*PartitionConfig"):
        nbdist.start(0, slurm="-N5", iface=IFACE, quiet=True)  # 5 nodes of 3
    assert not jobs()


def test_no_slurm_commands_on_path(bed, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError, match="needs SLURM's commands on PATH.*login node"):
        nbdist.start(0, slurm="-N1", iface=IFACE, quiet=True)


def test_nodes_that_cannot_reach_the_default_address_name_iface(released):
    # the nodes reach this machine on nbslbr0 only, not on the default route's interface
    with pytest.raises((StartError, DistTimeoutError), match="give --iface"):
        nbdist.start(0, slurm="-N1", start_timeout=8, quiet=True)


def test_srun_launchers_outside_an_allocation_leave_nothing_queued(full):
    """The old way (``--hosts H --launcher srun`` outside any allocation: one job per host):
    a start timeout ends the queued sruns with SIGTERM, so SLURM cancels their jobs."""
    with pytest.raises(DistTimeoutError):
        nbdist.start(0, hosts="nbnode1:1", launcher="srun", iface=IFACE, start_timeout=4,
                     quiet=True)
    wait_until(lambda: jobs() == [full], 10.0, "the queued srun's job to be cancelled")


def test_a_node_cut_off_is_a_host_lost_and_release_still_empties_the_queue(released, capfd):
    c = nbdist.start(0, slurm="-N2", iface=IFACE, quiet=True)
    subprocess.run(["ip", "link", "set", "nbslv2", "down"], check=True, timeout=30)
    try:
        _wait_said(capfd, "host nbnode2 lost (no heartbeat for 4s): rank 2 gone", 20.0)
        assert c.ranks[1].alive and not c.ranks[2].alive
        with pytest.raises(WorkerDiedError, match="nbnode2"):
            c.run("1", ranks=[2], show=False)
        assert c.run("1", ranks=[1], show=False) == {1: "1"}
    finally:
        subprocess.run(["ip", "link", "set", "nbslv2", "up"], check=True, timeout=30)
