"""``--ray`` before any cluster: options checked in the flag's terms, and a kernel that sees no
Ray cluster told so at once, with nothing started. No test bed needed (ray installed)."""

from __future__ import annotations

import importlib.util

import pytest

import nbdist
from nbdist.errors import StartError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray is not installed (pip install ray)")


@pytest.mark.parametrize(("options", "words"), [
    ("--nodes 0", "--nodes and --ranks-per-node must be at least 1"),
    ("--strategy NEAR", "--strategy must be one of SPREAD, PACK"),
    ("--resources '[1]'", "--resources must be a JSON object of numbers"),
    ("--resources '{'", "--resources must be a JSON object of numbers"),
    ("--bogus 1", "unknown option '--bogus'"),
    ("--gpus 0.5", "--gpus per node must be whole"),
    ("--cpus -1", "cannot be negative"),
    ("--nodes two", "invalid int value"),
])
def test_bad_options_say_what_to_do_and_start_nothing(options, words):
    with pytest.raises(ValueError, match=words):
        nbdist.start(0, ray=options, quiet=True)
    assert nbdist.current() is None


def test_ray_and_hosts_or_slurm_together_are_refused():
    with pytest.raises(ValueError, match="--ray and --hosts both say where ranks run"):
        nbdist.start(0, ray="--nodes 1", hosts="h:1", iface="lo", quiet=True)
    with pytest.raises(ValueError, match="--slurm and --ray both"):
        nbdist.start(0, ray="--nodes 1", slurm="-N1", quiet=True)


def test_no_cluster_in_sight_is_said_at_once(monkeypatch):
    from ray._private.services import find_gcs_addresses

    if find_gcs_addresses():
        pytest.skip("a Ray cluster runs on this machine: `auto` would find it")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(StartError, match="could not connect to Ray at auto: Could not find any "
                                         "running Ray instance.*give --address or RAY_ADDRESS"):
        nbdist.start(0, ray="--nodes 1", quiet=True)
    assert nbdist.current() is None
