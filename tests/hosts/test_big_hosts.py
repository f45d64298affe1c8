"""A big world across hosts (issue 52): 8 fake hosts x 16 ranks (tests/fakehosts.py: network
namespaces on a bridge) start, run a cell and a view call (8 frames from the notebook, one to
each host's agent, not 128), show a line every rank prints once,
notice a killed host within 5 s and heal it, restart, and stop leaving nothing on any host.
Skipped, with the reason, where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from conftest import expand_ranks, wait_until
from fakehosts import FakeHosts, can_make_namespaces

import nbdist

WHY = can_make_namespaces()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY is not None, reason=f"fake hosts: {WHY}")]

HOSTS, PER_HOST = 8, 16


def _pids_in(fh: FakeHosts, host: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", fh.ns[host]], capture_output=True, text=True,
                         timeout=30)
    return [int(p) for p in out.stdout.split()]


def _ranks_led(line: str) -> list[int]:
    """The ranks of an aggregated line's lead: ``[worker17-48,81-96] ...`` -> 17..48, 81..96."""
    return expand_ranks(line[line.index("[") + 1:line.index("]")])


def _netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


@pytest.fixture
def fakehosts():
    fh = FakeHosts([f"h{i}" for i in range(HOSTS)])
    try:
        yield fh
    finally:
        nbdist.stop()
        nbdist.release_hosts()
        fh.close()


@pytest.mark.timeout(900)
def test_eight_hosts_of_sixteen_ranks_run_heal_restart_and_stop_clean(fakehosts, capfd):
    fh = fakehosts
    hosts = {fh.ns[h]: PER_HOST for h in fh.names}
    c = nbdist.start(0, hosts=hosts, iface=fh.address, launcher=fh.launcher, heal=True,
                     quiet=True)
    world = HOSTS * PER_HOST + 1
    assert len(c.ranks) == world
    # a cell on every rank: each answers from its own host's namespace
    result = c.run("import os\nos.readlink('/proc/self/ns/net')", show=False)
    assert len(result) == world - 1
    sent = c.frames.last_cell  # one frame to each host's agent, which relays it to its ranks
    assert (sent.frames, sent.relayed) == (HOSTS, HOSTS), vars(sent)
    for r, value in result.items():
        host = c.ranks[r].host
        assert value.strip("'") == _netns(_pids_in(fh, next(
            h for h in fh.names if fh.ns[h] == host))[0]), f"rank {r} is not on {host}"
    # a view call reaches every rank
    def back() -> int:  # frames the agents relayed to the notebook
        return sum(a.relayed_frames for a in c._world.agents.values())

    calls, answers = c.frames.message("call").frames, back()
    pids = c[:].call(os.getpid)
    assert sorted(pids) == list(range(1, world))
    assert c.frames.message("call").frames - calls == HOSTS  # a view call: a frame a host
    # ... and about a frame a host back: a host's answers wait for each other (up to HOLD)
    assert back() - answers <= 2 * HOSTS, back() - answers
    # a line every rank prints at once shows once per batch that brought it (a host's agent
    # sends its ranks' equal lines once), led by the ranks: every rank once, in a few lines
    capfd.readouterr()
    c.run("print('hello from every host')")
    c.flush()
    shown = [ln for ln in capfd.readouterr().out.splitlines() if "hello from every host" in ln]
    assert 1 <= len(shown) <= HOSTS, shown
    led = [r for ln in shown for r in _ranks_led(ln)]
    assert sorted(led) == list(range(1, world)), shown
    # a killed host: its ranks are marked dead within 5 s, and --heal brings them back there
    victim = fh.names[3]
    lost = [r for r, i in c.ranks.items() if i.host == fh.ns[victim]]
    assert len(lost) == PER_HOST
    agent = c._world.agents[fh.ns[victim]]
    os.kill(agent.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    wait_until(lambda: not any(c.ranks[r].alive for r in lost), 10.0,
               f"the ranks of {victim} to be marked dead after its agent was killed")
    assert time.monotonic() - t0 < 5.0, "a lost host is noticed within 5 s"
    wait_until(lambda: all(c.ranks[r].alive for r in range(world)) and c.running, 300.0,
               f"--heal to bring the ranks of {victim} back")
    assert c.run("1", ranks=lost[:2], show=False) == {lost[0]: "1", lost[1]: "1"}
    # a full restart, then the stop leaves nothing on any host
    c = c.restart(quiet=True)
    assert all(c.ranks[r].alive for r in range(world))
    assert c.run("2", ranks=[1, world - 1], show=False) == {1: "2", world - 1: "2"}
    c.stop()
    nbdist.release_hosts()
    for h in fh.names:
        wait_until(lambda h=h: not _pids_in(fh, h), 15.0, f"nothing left running on {h}")
