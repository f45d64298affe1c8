"""Host lists and launcher command lines, as `%dist_start --hosts` reads them (no hosts
needed: `scontrol` is a stand-in on PATH that prints what SLURM would)."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from nbdist.hosts.host_agents import launcher_argv
from nbdist.hosts.slurm import enclosing_hosts
from nbdist.spec import WorldSpec, parse_hosts


def test_host_lists_in_every_form_keep_their_order():
    assert parse_hosts("b:2, a:3") == (("b", 2), ("a", 3))
    assert parse_hosts({"n1": 4, "n2": 1}) == (("n1", 4), ("n2", 1))
    assert parse_hosts([("x", "2")]) == (("x", 2),)
    assert parse_hosts("solo") == (("solo", 1),)
    assert parse_hosts("user@n1:2") == (("user@n1", 2),)
    assert parse_hosts(None) == () == parse_hosts("")


def test_ranks_are_placed_local_first_then_each_host_in_order():
    spec = WorldSpec(2, hosts=(("a", 2), ("b", 1)), iface="lo").validate()
    assert spec.world_size == 6
    assert spec.placement() == [None, None, None, "a", "a", "b"]
    assert spec.names() == ["worker0", *(f"worker{r}" for r in range(1, 6))]


def test_slurm_hosts_come_from_scontrol(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(textwrap.dedent("""\
        #!/bin/sh
        [ "$1 $2 $3" = "show hostnames node[1-2]" ] || exit 3
        printf 'node1\\nnode2\\n'
    """))
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")
    assert enclosing_hosts("slurm") == (["node1", "node2"], "4")
    assert enclosing_hosts("node1") is None
    assert parse_hosts("slurm", enclosing_hosts) == (("node1", 4), ("node2", 4))
    assert parse_hosts("slurm:2", enclosing_hosts) == (("node1", 2), ("node2", 2))
    assert parse_hosts("node1:3", enclosing_hosts) == (("node1", 3),)


def test_launchers_quote_the_host_and_the_command():
    cmd = [sys.executable, "-m", "nbdist.join"]
    assert launcher_argv("ssh", "n1", cmd) == ["ssh", "-o", "BatchMode=yes", "n1", *cmd]
    assert launcher_argv("srun", "n1", cmd) == ["srun", "--nodes=1", "--ntasks=1",
                                                "--nodelist=n1", *cmd]
    assert launcher_argv("docker exec -i {host} {command}", "box 1", cmd) == \
        ["docker", "exec", "-i", "box 1", *cmd]
    with pytest.raises(ValueError, match="has no {command}"):
        launcher_argv("ssh {host}", "n1", cmd)
    with pytest.raises(ValueError, match="only fields"):
        launcher_argv("x {host} {cmd} {command}", "n1", cmd)
