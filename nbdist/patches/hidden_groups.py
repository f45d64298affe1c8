"""The process groups of this process, put aside while a spawned function runs.

A script's spawned process starts with no process group: ``dist.is_initialized()`` is False
and its own ``init_process_group`` makes whatever group it names. A rank of a world that has
a default group (``--process-group``, ``--no-rpc``) runs a spawned function in a process that
has one. ``hide`` takes every group torch knows in this process out of ``torch.distributed``'s
books (default group, names, ranks, tags, and the registry of names that collectives
resolve), so the function sees none; ``Hidden.restore`` puts them back once the groups the
function made are ended. The hidden groups stay alive and untouched meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import torch_private

__all__ = ["Hidden", "hide"]

# torch's per-process books on groups (``distributed_c10d._world``), each a dict
_BOOKS = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag",
          "pg_coalesce_state")


@dataclass
class Hidden:
    """Groups taken out of torch's books by ``hide``."""

    default: Any
    books: dict[str, dict] = field(default_factory=dict)
    tags: dict[str, list] = field(default_factory=dict)
    comms: list = field(default_factory=list)
    count: int = 0

    def restore(self) -> bool:
        """Put the groups back; False (and nothing changed) when a default group is up again,
        which the function made and did not end."""
        import torch.distributed as dist
        from torch._C import _distributed_c10d as native
        from torch.distributed import distributed_c10d as c10d

        if dist.is_initialized():
            return False
        world = c10d._world
        for book, saved in self.books.items():
            getattr(world, book).update(saved)
        for tag, groups in self.tags.items():
            world.tags_to_pg.setdefault(tag, []).extend(groups)
        if isinstance(getattr(world, "comms", None), list):  # torch >= 2.9
            world.comms.extend(self.comms)
        world.group_count = self.count
        for pg, name in self.books["pg_names"].items():
            native._register_process_group(name, pg)
        c10d._update_default_pg(self.default)
        return True


def hide() -> Hidden | None:
    """Take every group out of torch's books if a default group is up (None otherwise, or
    where this torch's books are not the ones nbdist knows)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() \
            or not torch_private.usable("hidden_groups"):
        return None
    from torch._C import _distributed_c10d as native
    from torch.distributed import distributed_c10d as c10d

    world = c10d._world
    hidden = Hidden(world.default_pg,
                    {book: dict(getattr(world, book)) for book in _BOOKS},
                    {tag: list(groups) for tag, groups in world.tags_to_pg.items()},
                    list(getattr(world, "comms", None) or ()), world.group_count)
    for name in hidden.books["pg_names"].values():
        native._unregister_process_group(name)
    for book in _BOOKS:
        getattr(world, book).clear()
    world.tags_to_pg.clear()
    if isinstance(getattr(world, "comms", None), list):  # torch >= 2.9
        world.comms.clear()
    world.group_count = 0
    c10d._update_default_pg(None)
    return hidden
