"""``init_process_group`` and ``destroy_process_group`` called by user code on a rank of a world.

Inside a world (``attach`` until the world ends) ``init_process_group`` joins through its private
store whatever ``init_method`` says, so no port is opened (torch's TCP store on a fixed port
collides between notebooks and listens on every interface); rank 0 says so once per world.
Otherwise the calls act as in a script, torch's errors included: members naming the same
rendezvous and size meet (``rendezvous``); a default group the world made (``--process-group``)
is taken by a call asking for exactly it and ended by any other; a default group an earlier
cell made or took and left is ended by the next call, which meets afresh (a script run again
is a new process: its ranks may have destroyed their part or not); ``destroy_process_group``
ends the default group whoever made it and keeps destroyed groups alive (``graveyard``); a
group larger than the world raises ``ValueError``; a user group waits at most
``--rpc-timeout`` unless the call gives a timeout.
``NBDIST_PATCH_PROCESS_GROUP=0`` leaves torch's functions alone; nbdist's own groups go through
``torch_init`` and ``destroy_own``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .. import world_state
from ..envflag import switched_on
from ..groups import graveyard, rendezvous
from . import on_import, torch_private
from .replaced import replace, restore

__all__ = ["FLAG", "Membership", "attach", "destroy_own", "install",
           "install_on_import", "installed", "torch_init", "uninstall"]

FLAG = "NBDIST_PATCH_PROCESS_GROUP"
_PREFIX = "nbdist-user"


@dataclass(frozen=True)
class Membership:
    """What a world tells this process: its rank, the world's size, where user groups meet."""

    rank: int
    world_size: int
    name: str
    store: Callable[[], Any]  # makes the world's private store for user groups (once)
    timeout: float  # seconds: a user group's default timeout
    backend: str | None = None  # the backend of the default group the world made, if any
    why: str = ""  # what made the world's group ("--process-group gloo"), for messages


@dataclass
class _TorchOwn:
    """torch's own functions, kept once ``install`` put nbdist's in their place: per process."""

    init: Any = None
    destroy: Any = None
    signature: inspect.Signature | None = None
    in_place: bool = False  # nbdist's functions are in torch's modules now (``uninstall``)


@dataclass
class _InWorld:
    """What this process knows of the world it is in: a ``world_state`` part, filled by
    ``attach``; it closes with the world (``close``). A child forked from a rank (a
    DataLoader worker, a ``multiprocessing`` child) is in no world: its calls are torch's."""

    member: Membership | None = None  # None until ``attach``
    own_group: Any = None  # the default group the world made (None: none)
    base: Any = None  # the world's store, made on first use
    said: bool = False  # the one line about ports was printed in this world
    borrowed: bool = False  # the user's init took the world's own group
    borrowed_in: object = None  # the cell whose init took it (``_cell_now``)
    made: bool = False  # the default group now is one user code made here
    made_in: object = None  # the cell that made it (``_cell_now``)
    excepthook: Any = None  # before the user's init (torch wraps it at every init)
    timeout: float = 0.0  # the last user group's timeout, seconds
    # the stores of the user groups made in this world: torch keeps only their C++ half, whose
    # methods are the Python object's (new_group, DeviceMesh call them long after the init)
    stores: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """The world ends here: a default group user code made in it and left is ended (kept
        alive, as any), and torch's functions behave as torch's again."""
        if self.member is None:
            return
        if self.made:
            _destroy(None, self)
        close = getattr(self.base, "close", None)  # a host world's store: its sockets end here
        if close is not None:
            close()
        self.member = None


_TORCH_OWN_PER_PROCESS = _TorchOwn()


def _world() -> _InWorld | None:
    """The world this process is in, None between worlds (and in a forked child)."""
    world = world_state.peek(_InWorld)
    return world if world is not None and world.member is not None else None


def installed() -> bool:
    return _TORCH_OWN_PER_PROCESS.in_place


def install() -> bool:
    """Put nbdist's functions in ``torch.distributed`` (unless switched off: then False, and a
    world does not attach); True if they are in place."""
    if not switched_on(FLAG):
        return False
    if installed():
        return True
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    own = _TORCH_OWN_PER_PROCESS
    own.init, own.destroy = c10d.init_process_group, c10d.destroy_process_group
    own.signature = inspect.signature(own.init)
    mine = {own.init: init_process_group, own.destroy: destroy_process_group}
    # torch's modules that bound the names at their import (device_mesh's init_device_mesh)
    for module in (dist, c10d, sys.modules.get("torch.distributed.device_mesh")):
        for attr in ("init_process_group", "destroy_process_group"):
            if module is not None and getattr(module, attr, None) in mine:
                replace("process_group", module, attr, mine[getattr(module, attr)])
    own.in_place = True
    return True


def uninstall() -> list[str]:
    """torch's own ``init_process_group`` and ``destroy_process_group`` again (names bound
    from nbdist's meanwhile stay nbdist's, which act as torch's outside a world); what stayed
    in place."""
    left = restore("process_group")
    if not left:
        _TORCH_OWN_PER_PROCESS.in_place = False
    return left


def install_on_import() -> None:
    """``install`` as soon as torch's process-group module is imported (now, if it is): a name
    bound from it before a world starts (``from torch.distributed import
    init_process_group``, torch's own ``init_device_mesh``) is then nbdist's, and acts as
    torch's until a world attaches."""
    if switched_on(FLAG):
        on_import.after_import("torch.distributed.distributed_c10d", lambda _module: install())


def torch_init(*args: Any, **kwargs: Any) -> Any:
    """torch's own ``init_process_group`` (for the groups nbdist makes itself)."""
    _name_first_group()
    if _TORCH_OWN_PER_PROCESS.init is not None:
        return _TORCH_OWN_PER_PROCESS.init(*args, **kwargs)
    import torch.distributed as dist

    return dist.init_process_group(*args, **kwargs)


def attach(member: Membership, own_group: Any = None) -> None:
    """This process is now ``member`` of a world; ``own_group``: the default group the world
    made (or None). Attached again in the same world, a group user code made stays."""
    world = world_state.part(_InWorld)
    world.member, world.own_group, world.base = member, own_group, None
    world.said, world.borrowed, world.borrowed_in = False, False, None


def _world_groups(group: Any) -> list[Any]:
    """The groups a ``destroy_process_group(group)`` ends: every one for the default group."""
    import torch.distributed as dist

    if group is not None and group is not dist.group.WORLD:
        return [group]
    if torch_private.usable("process_group"):
        from torch.distributed import distributed_c10d as c10d

        return list(c10d._world.pg_map)
    return [dist.group.WORLD]


def destroy_own(group: Any = None) -> None:
    """End ``group`` (default: every group) without freeing it where that could freeze."""
    _destroy(group, _world())


def _destroy(group: Any, world: _InWorld | None) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    graveyard.bury(_world_groups(group),
                   max(world.timeout, world.member.timeout) if world is not None else 1800.0)
    if _TORCH_OWN_PER_PROCESS.destroy is not None:
        _TORCH_OWN_PER_PROCESS.destroy(group)
    else:
        dist.destroy_process_group(group)
    if world is not None and (group is None or group is dist.group.WORLD
                              or not dist.is_initialized()):
        world.made = False
        if world.excepthook is not None:
            sys.excepthook, world.excepthook = world.excepthook, None


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """torch's ``init_process_group``; in a world, through the world's store (module doc)."""
    own, world = _TORCH_OWN_PER_PROCESS, _world()
    assert own.signature is not None
    if world is None:
        return own.init(*args, **kwargs)
    import torch.distributed as dist

    member = world.member
    bound = own.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a["store"] is not None:  # the user made a store: theirs to keep
        return own.init(**a)
    size, rank = _size_and_rank(member, a)
    _check(member, size)
    if _world_group_is_default():
        if world.borrowed and world.borrowed_in != _cell_now():
            # an earlier cell took it and left it: a script run again starts without it. The
            # other ranks may have ended their part (destroy_process_group), so it is not
            # taken again: every rank meets afresh below, whichever it did.
            _end_borrowed_group(member)
        elif _matches(member, a["backend"], rank, size):
            _borrow(world)
            return None
        else:
            _end_world_group()  # a script has no group before its own: this rank's goes
    if dist.is_initialized() and world.made and world.made_in != _cell_now():
        _end_earlier_group(member)  # a script run again starts clean
    if dist.is_initialized():  # the user's own group, still up: torch's "twice" error
        return own.init(**a)
    graveyard.release()
    if world.base is None:
        world.base = member.store()
    timeout = a["timeout"] or timedelta(seconds=member.timeout)
    meeting = rendezvous.Meeting(world.base, _PREFIX, rendezvous.name(a["init_method"]),
                                 size, timeout.total_seconds())
    _say_once(world, a["init_method"])
    hook = sys.excepthook
    _name_first_group()
    a.update(init_method=None, store=meeting.store, rank=rank, world_size=size, timeout=timeout)
    try:
        meeting.meet_rank0(rank, timeout.total_seconds())
        own.init(**a)
    except BaseException as exc:
        meeting.leave()  # the next try meets the others under fresh keys
        _name_first_group()
        if isinstance(exc, Exception):
            raise _explain(exc, member, rank, size, timeout) from exc
        raise
    world.made, world.made_in = True, _cell_now()
    world.stores.append(meeting.store)
    world.excepthook, world.timeout = hook, timeout.total_seconds()
    return None


def destroy_process_group(group: Any = None) -> None:
    """torch's ``destroy_process_group``; the groups it ends are freed only once that is safe.
    The world's own group, while it is the default, is ended on this rank like any other."""
    import torch.distributed as dist

    if not dist.is_initialized() and _TORCH_OWN_PER_PROCESS.destroy is not None:
        return _TORCH_OWN_PER_PROCESS.destroy(group)  # torch's own error
    if (group is None or group is dist.group.WORLD) and _world_group_is_default():
        _end_world_group()
        return None
    graveyard.release()
    destroy_own(group)
    return None


def _size_and_rank(member: Membership, a: dict) -> tuple[int, int]:
    """The group's size and this rank's number: as given, else (``env://``, torch's default)
    ``WORLD_SIZE`` and ``RANK`` from the environment, else the world's."""
    import os

    env = a["init_method"] is None or str(a["init_method"]).startswith("env://")

    def pick(given: Any, name: str, world: int) -> int:
        if given not in (None, -1):
            return int(given)
        if env and os.environ.get(name, "").strip().lstrip("-").isdigit():
            return int(os.environ[name])
        return world

    return pick(a["world_size"], "WORLD_SIZE", member.world_size), \
        pick(a["rank"], "RANK", member.rank)


def _cell_now() -> object:
    """Which cell this process runs now: a worker's cell number, the notebook's execution
    count (None outside IPython)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None:
        return None
    return getattr(shell, "nbdist_exec_id", None) or shell.execution_count


def _end_earlier_group(member: Membership) -> None:
    """The default group an earlier cell made (and never destroyed, as torchrun-style code
    does not) ends: a script's next run is a new process without it. In one cell, a second
    init is torch's error."""
    if member.rank == 0:
        print("nbdist: init_process_group ends the default group an earlier cell made and "
              "left, as that run's end would have", file=sys.stderr)
    destroy_own()


def _end_borrowed_group(member: Membership) -> None:
    """The world's own group, taken by an earlier cell's init and left, ends on this rank."""
    if member.rank == 0:
        print("nbdist: init_process_group ends the world's own process group an earlier cell "
              "took and left, as that run's end would have; the ranks meet afresh",
              file=sys.stderr)
    _end_world_group()


def _world_group_is_default() -> bool:
    import torch.distributed as dist

    world = _world()
    return world is not None and world.own_group is not None and dist.is_initialized() \
        and dist.group.WORLD is world.own_group


def _end_world_group() -> None:
    """This rank's part of the world's own group ends (kept alive underneath, graveyard):
    from here on the rank has no default group, as a script's process before its first."""
    world = _world()
    if world is not None:
        world.own_group, world.borrowed, world.borrowed_in = None, False, None
    destroy_own()


def _name_first_group() -> None:
    """torch names a default group by a per-process count that only a destroy resets; one a
    failed attempt left raised would give this rank other keys than its peers' (the next
    world's own group among them). Nothing is done while a default group is up."""
    import torch.distributed as dist

    if torch_private.usable("process_group") and not dist.is_initialized():
        from torch.distributed import distributed_c10d as c10d

        c10d._world.group_count = 0


def _check(member: Membership, size: int) -> None:
    """ValueError for a group larger than the world: its members could never all come (torch
    would wait for them until the group's timeout)."""
    if size > member.world_size:
        raise ValueError(f"init_process_group(world_size={size}) was called on rank "
                         f"{member.rank} ({member.name}) of this nbdist world of "
                         f"{member.world_size}: a group of {size} needs {size} processes; "
                         f"`%dist_restart {size - 1} --keep` makes a world of {size} (the "
                         f"notebook and {size - 1} workers)")


def _matches(member: Membership, backend: Any, rank: int, size: int) -> bool:
    """Whether an ``init_process_group`` asks for exactly the group the world made: same
    rank, size and backend. No backend asks for torch's default ("undefined" to
    ``get_backend``), which is not the world's group."""
    wanted = str(backend).lower() if backend is not None else None
    return rank == member.rank and size == member.world_size and wanted is not None \
        and wanted == member.backend


def _borrow(world: _InWorld) -> None:
    """The world already made the default group this call asks for: it is taken as the
    user's (their ``destroy_process_group`` ends it on this rank)."""
    member = world.member
    if not world.borrowed and member.rank == 0 and not world.said:
        world.said = True
        print(f"nbdist: init_process_group takes this world's own process group "
              f"({member.why}) as it is: same ranks, same backend, no port opened",
              file=sys.stderr)
    world.borrowed, world.borrowed_in = True, _cell_now()


def _say_once(world: _InWorld, init_method: Any) -> None:
    if world.member.rank != 0 or world.said:
        return
    world.said = True
    how = f"init_method={init_method!r}" if init_method else "env://"
    print(f"nbdist: init_process_group joins this world's private rendezvous instead of "
          f"{how}: no port is opened (an address names the rendezvous only)", file=sys.stderr)


def _explain(exc: Exception, member: Membership, rank: int, size: int,
             timeout: timedelta) -> Exception:
    """A rendezvous that timed out says which rank waited, and for what, in the error a
    script's would raise (``DistStoreError``, whatever the Gloo of this torch made of ours)."""
    text = str(exc)
    if "imeout" not in text and "timed out" not in text.lower():
        return exc
    if "rank 0 of a group" in text:  # meet_rank0's: already says it
        return exc
    others = [str(r) for r in range(size) if r != rank]
    who = f"rank{'s' if len(others) > 1 else ''} {', '.join(others)}"
    msg = (f"rank {rank} ({member.name}) waited {timeout.total_seconds():g}s in "
           f"init_process_group for {who} to join a group of {size}: every rank "
           f"0..{size - 1} must call it (from the notebook, `%%dist --local` runs a cell on all "
           f"ranks at once)")
    import torch.distributed as dist

    return dist.DistStoreError(msg)  # a script's store-based rendezvous times out with it
