"""Who am I in the RPC world: rank, size, local rank and worker names, read live.

TorchOpt reads ``RANK``/``WORLD_SIZE`` once, when the module is imported, so in a notebook
(where the world starts later, from a cell) every process believes it is rank 0 of a world of
size 1. Here every call asks the running RPC agent; only when no RPC world is up do the
``torchrun`` environment variables (read at call time) answer instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NamedTuple

from ..patches import rpc_agent

__all__ = [
    "WorldInfo",
    "default_worker_name_format",
    "format_worker_name",
    "get_local_rank",
    "get_local_world_size",
    "get_rank",
    "get_worker_id",
    "get_worker_name",
    "get_world_info",
    "get_world_rank",
    "get_world_size",
    "rpc_live",
    "set_worker_name_format",
    "worker_names",
]


def default_worker_name_format(world_rank: int, world_size: int, local_rank: int,
                               local_world_size: int) -> str:
    """``worker{rank}``: the name nbdist gives its ranks (``worker0`` is the notebook)."""
    return f"worker{world_rank}"


class _Naming:
    """How this process names workers (``set_worker_name_format``; later worlds keep it)."""

    format: Callable[..., str] = staticmethod(default_worker_name_format)


_NAMING_PER_PROCESS = _Naming()


def set_worker_name_format(fmt: Callable[..., str] | str | None) -> Callable[..., str]:
    """Remember how ``auto_init_rpc`` names workers; a str is a pattern such as ``"w{rank}"``."""
    if fmt is None:
        fmt = default_worker_name_format
    elif isinstance(fmt, str):
        pattern = fmt

        def fmt(world_rank: int, world_size: int, local_rank: int,
                local_world_size: int) -> str:
            return pattern.format(rank=world_rank, world_rank=world_rank, world_size=world_size,
                                  local_rank=local_rank, local_world_size=local_world_size)

    elif not callable(fmt):
        raise TypeError(f"worker_name_format must be a callable or a str pattern, got {fmt!r}")
    _NAMING_PER_PROCESS.format = fmt
    return fmt


def format_worker_name(world_rank: int, world_size: int, local_rank: int,
                       local_world_size: int) -> str:
    """The name the current ``worker_name_format`` gives a rank."""
    return _NAMING_PER_PROCESS.format(world_rank=world_rank, world_size=world_size,
                                      local_rank=local_rank, local_world_size=local_world_size)


class WorldInfo(NamedTuple):
    """A snapshot of this process's place in the world."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    worker_name: str

    @property
    def rank(self) -> int:
        """Same as ``world_rank``."""
        return self.world_rank

    @property
    def worker_id(self) -> int:
        """The RPC worker id, which is the world rank."""
        return self.world_rank


def _agent() -> Any:
    """The running RPC agent of this process, or None when no RPC world is up."""
    return rpc_agent.current()


def rpc_live() -> bool:
    """Whether this process is in a running RPC world now."""
    return _agent() is not None


def _env_int(key: str, default: int) -> int:
    raw = os.environ.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not a whole number") from None


def get_world_info() -> WorldInfo:
    """This process's rank, world size, local rank, local world size and worker name.

    Read from the running RPC world when there is one; otherwise from ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` as they are now (what ``torchrun``
    sets), defaulting to a world of one.
    """
    agent = _agent()
    if agent is None:
        rank, size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        local_rank = _env_int("LOCAL_RANK", rank)
        local_size = _env_int("LOCAL_WORLD_SIZE", size)
        return WorldInfo(rank, size, local_rank, local_size,
                         format_worker_name(rank, size, local_rank, local_size))
    me = agent.get_worker_info()
    size = len(agent.get_worker_infos())
    rank = int(me.id)
    # torchrun's LOCAL_* describe this world only if its RANK/WORLD_SIZE agree with the live
    # one; nbdist starts every rank on this machine, so there local == global.
    if (_env_int("RANK", -1), _env_int("WORLD_SIZE", -1)) == (rank, size) \
            and "LOCAL_RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        local_rank, local_size = _env_int("LOCAL_RANK", rank), _env_int("LOCAL_WORLD_SIZE", size)
    else:
        local_rank, local_size = rank, size
    return WorldInfo(rank, size, local_rank, local_size, str(me.name))


def get_world_rank() -> int:
    """The global rank of this process (0 is the notebook in an nbdist world)."""
    return get_world_info().world_rank


get_rank = get_world_rank


def get_world_size() -> int:
    """How many ranks the world has, this one included."""
    return get_world_info().world_size


def get_local_rank() -> int:
    """The rank of this process among the ranks on this machine."""
    return get_world_info().local_rank


def get_local_world_size() -> int:
    """How many ranks run on this machine."""
    return get_world_info().local_world_size


def worker_names() -> list[str]:
    """Every rank's worker name, indexed by rank."""
    agent = _agent()
    if agent is None:  # not started yet: the names ``auto_init_rpc`` would give the ranks
        info = get_world_info()
        return [format_worker_name(r, info.world_size, r % info.local_world_size,
                                   info.local_world_size) for r in range(info.world_size)]
    infos = sorted(agent.get_worker_infos(), key=lambda w: w.id)
    return [str(w.name) for w in infos]


def _describe_world() -> str:
    return ", ".join(f"{r}={nm}" for r, nm in enumerate(worker_names()))


def get_worker_id(id: int | str | Any | None = None) -> int:  # noqa: A002 - TorchOpt's name
    """The rank of a worker given by rank, name or ``WorkerInfo``; None means this process.

    Raises ``ValueError`` naming the world's workers when there is no such rank or name.
    """
    if id is None:
        return get_world_rank()
    if isinstance(id, bool):
        raise TypeError(f"a worker is a rank (int) or a name (str), got {id!r}")
    if isinstance(id, int):
        size = get_world_size()
        if not 0 <= id < size:
            raise ValueError(f"no rank {id} in this world of {size}: {_describe_world()}")
        return id
    if isinstance(id, str):
        names = worker_names()
        if id in names:
            return names.index(id)
        raise ValueError(f"no worker named {id!r} in this world: {_describe_world()}")
    wid = getattr(id, "id", None)
    if isinstance(wid, int):
        return get_worker_id(wid)
    raise TypeError(f"a worker is a rank (int), a name (str) or a WorkerInfo, got {id!r}")


def get_worker_name(id: int | str | Any | None = None) -> str:  # noqa: A002
    """The name of a worker given by rank, name or ``WorkerInfo``; None means this process."""
    return worker_names()[get_worker_id(id)]
