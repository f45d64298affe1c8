"""``RankConfig``: what the notebook builds for each worker rank, as it travels (pickled in a
control frame), as a host's agent adapts it, and as a kept rank takes a new world's."""

from __future__ import annotations

import dataclasses
import os

import pytest

from nbdist.cluster.startup import worker_config
from nbdist.control import protocol
from nbdist.groups import torchrun_env
from nbdist.hosts import join_agent as agent
from nbdist.hosts.scheduler import NodeShare
from nbdist.rank_config import STARTED_WITH, RankConfig, world_group
from nbdist.spec import WorldSpec


def _local(spec: WorldSpec, rank: int = 1, epoch: int = 1, **kw) -> RankConfig:
    names = spec.names()
    return worker_config(spec, names, rank, "/tmp/w", "/tmp/w/ctl", b"k" * 32, epoch,
                         world_group(spec, None), **kw)


@pytest.mark.parametrize(("spec", "group"), [
    (WorldSpec(2), (None, "--process-group None")),
    (WorldSpec(2, process_group="gloo"), ("gloo", "--process-group gloo")),
    (WorldSpec(2, rpc=False), ("gloo", "--no-rpc")),
    (WorldSpec(2, rpc=False, process_group="none"), (None, "--no-rpc")),
])
def test_the_default_group_and_its_why_are_decided_once_for_every_rank(spec, group):
    assert world_group(spec, None) == group
    cfg = _local(spec)
    assert (cfg.process_group, cfg.group_why) == group


def test_a_local_rank_gets_the_notebook_s_environment_and_file_rendezvous():
    spec = WorldSpec(2, threads=3, env={"X_FOR_RANKS": "1"})
    cfg = _local(spec, rank=2, epoch=4)
    assert (cfg.rank, cfg.name, cfg.world_size, cfg.host) == (2, "worker2", 3, None)
    assert cfg.env["X_FOR_RANKS"] == "1" and cfg.env["NBDIST_RANK"] == "2"
    assert cfg.env["OMP_NUM_THREADS"] == "3" and cfg.threads == 3
    assert cfg.env_extra is None and cfg.cwd == os.getcwd()
    assert cfg.rpc_init == "file:///tmp/w/rpc-4" and cfg.pg_init == "file:///tmp/w/pg-4"
    assert cfg.arrivals == "/tmp/w/arrivals-4" and cfg.user_groups == "/tmp/w/user-groups-4"
    assert cfg.launch_env == torchrun_env.variables(2, spec.placement())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rank = 3  # type: ignore[misc]


@pytest.mark.parametrize("tag", [protocol.Spawn, protocol.Rejoin])
def test_a_config_travels_whole_through_a_control_frame(tag):
    cfg = _local(WorldSpec(2, rpc=False))
    back = protocol.decode(protocol.encode(tag(cfg)))
    assert isinstance(back.config, RankConfig) and back.config == cfg


def test_a_kept_rank_keeps_what_it_started_with_and_takes_the_rest_of_the_new_world():
    old = _local(WorldSpec(2), epoch=1).adapted(affinity=[0], threads=7)
    new = _local(WorldSpec(2, process_group="gloo", rpc_timeout=9.0), epoch=2)
    got = old.rejoined(new)
    for f in dataclasses.fields(RankConfig):
        assert getattr(got, f.name) == getattr(old if f.name in STARTED_WITH else new, f.name)
    assert (got.epoch, got.process_group, got.pg_timeout, got.threads) == (2, "gloo", 9.0, 7)
    assert set(STARTED_WITH) <= {f.name for f in dataclasses.fields(RankConfig)}


def test_a_host_s_agent_completes_a_remote_rank_s_config():
    spec = WorldSpec(0, hosts=(("a", 2),), iface="lo", env={"X_FOR_RANKS": "1"}).validate()
    share = (NodeShare("a", 2, cpus=4), 1)
    cfg = worker_config(spec, spec.names(), 2, "/tmp/w", ("127.0.0.1", 1), b"k" * 32, 1,
                        world_group(spec, None), store=("127.0.0.1", 2), share=share)
    assert cfg.env is None and cfg.host == "a" and cfg.host_ranks == 2
    assert cfg.cpu_share == (1, 2) and cfg.threads == 2
    assert cfg.env_extra["LOCAL_RANK"] == "1" and cfg.env_extra["X_FOR_RANKS"] == "1"
    assert cfg.arrivals is None and cfg.user_groups is None
    here = agent._adapt(cfg, "lo")
    assert isinstance(here, RankConfig) and here.rank == 2
    assert here.env["X_FOR_RANKS"] == "1" and here.env["GLOO_SOCKET_IFNAME"] == "lo"
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // 2
    assert here.affinity == (cpus[per:2 * per] if per else None)
