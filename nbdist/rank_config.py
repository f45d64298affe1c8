"""What one rank needs to start and join a world: ``RankConfig``, built on the notebook
(``cluster.startup.worker_config``) for every rank, rank 0 included (``cluster.startup.Rank0``);
a worker's is pickled to the template or a host's agent (``protocol.Spawn``, ``Rejoin``) and
read by ``proc.worker``; each joins by it (``proc.membership.join``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .devices import Setup
from .spec import WorldSpec

__all__ = ["STARTED_WITH", "RankConfig", "world_group"]

#: What a kept rank keeps from the config it started with when it rejoins a new world: the
#: process's own setup, as its host adapted it (``hosts.join_agent``); the rest is the new world's.
STARTED_WITH = ("rank", "cwd", "env", "env_extra", "path", "threads", "host", "host_ranks",
                "cpu_share", "rpc_threads", "affinity")


@dataclass(frozen=True)
class RankConfig:
    """One rank of one world (plain values only: a worker's travels pickled)."""

    rank: int
    name: str
    world_size: int
    socket: str | tuple  # the notebook's control socket: a path, or (address, port)
    authkey: bytes
    cwd: str
    env: dict[str, str] | None  # the whole environment; None on another host (``env_extra``)
    env_extra: dict[str, str] | None  # what a host's agent adds to its own environment
    path: list[str]
    threads: int | None
    host: str | None  # None: this machine
    host_ranks: int  # ranks on its host (threads are shared among them)
    cpu_share: tuple[int, int] | None  # (k, n): the k-th of n ranks of a scheduler's node
    rpc: bool
    rpc_init: str
    rpc_timeout: float
    rpc_threads: int
    process_group: str | None  # the default group's backend; None: no group
    group_why: str  # what made the default group (``patches.process_group.Membership``)
    device: str | None
    device_maps: dict | None
    pg_init: str
    pg_timeout: float
    start_timeout: float
    epoch: int
    store: tuple | None  # a host world's store address (``proc.store``); None: files
    arrivals: str | None  # a local world without RPC: where ranks say they arrived
    arrived: str  # the key each says it with (``{rank}`` filled in)
    shm: dict | None  # ``shm.transport.world_config``; None: off
    user_groups: str | None  # a local world: the store of user code's groups
    launch_env: dict[str, str]  # torchrun's variables for this world
    affinity: list[int] | None = None  # its CPUs, set by a host's agent
    tp_transports: list[str] | None = None  # TensorPipe's transports (None: torch's own)

    def adapted(self, **changes: Any) -> RankConfig:
        """This config with ``changes`` (a host's agent makes it right for its host)."""
        return dataclasses.replace(self, **changes)

    def rejoined(self, new: RankConfig) -> RankConfig:
        """The config of a kept rank in world ``new``: ``new``, but what the process
        started with (``STARTED_WITH``) stays."""
        return dataclasses.replace(new, **{k: getattr(self, k) for k in STARTED_WITH})


def world_group(spec: WorldSpec, gpu: Setup | None) -> tuple[str | None, str]:
    """The backend of a world's default process group (None: none) and the words that say
    what made it (``--no-rpc`` or ``--process-group B``), for rank 0 and every worker."""
    backend = (gpu.backend if gpu is not None else spec.group_backend) or None
    return backend, "--no-rpc" if not spec.rpc else f"--process-group {backend}"
