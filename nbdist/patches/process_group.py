"""``init_process_group`` and ``destroy_process_group`` called by user code on a rank of a world.

The tutorials' ``setup()`` sets ``MASTER_ADDR``/``MASTER_PORT`` and calls
``init_process_group(backend, rank=r, world_size=n)``: under torch that opens a TCP store on a
fixed port (two notebooks collide, and it listens on every interface). Inside a world
(``attach`` .. ``detach``) the call joins a group through the world's own private store
instead, whatever ``init_method`` says (``env://``, ``tcp://``, ``file://``): no port is
opened, and one line on rank 0 says so, once per world. Each group gets fresh keys: a
generation per group size that every member advances in step (members of a group of ``n``
are always ranks 0..n-1, so their counts agree).

- Where the world made the default group itself (``--process-group``, ``--no-rpc``), a
  matching call uses it instead of failing "twice"; the user's ``destroy_process_group()``
  then leaves it be.
- A rank or size this world cannot match raises ``ValueError`` naming both.
- ``destroy_process_group`` keeps each destroyed group alive (``graveyard``), so no later free
  of a model that still holds it can freeze the process.
- A user group waits at most the world's timeout (``--rpc-timeout``) unless the call gives
  one; a rank that waited in vain says which rank and what for.

``NBDIST_PATCH_PROCESS_GROUP=0`` leaves torch's functions alone. nbdist's own groups are made
and ended through ``torch_init`` and ``destroy_own``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..envflag import switched_on
from . import graveyard, torch_private

__all__ = ["FLAG", "Membership", "attach", "destroy_own", "detach", "install", "installed",
           "torch_init"]

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


class _State:
    torch_init: Any = None  # torch's own functions, once installed
    torch_destroy: Any = None
    signature: inspect.Signature | None = None
    member: Membership | None = None
    base: Any = None  # the world's store, made on first use
    generations: dict[int, int] = {}  # group size -> groups of that size made in this world
    said = False  # the one line about ports was printed in this world
    own_group: Any = None  # the default group the world made (None: none)
    borrowed = False  # the user's init took the world's own group
    made = False  # the default group now is one user code made here
    excepthook: Any = None  # before the user's init (torch wraps it at every init)
    timeout = 0.0  # the last user group's timeout, seconds
    recorded: Any = None  # the store class that remembers a rank's keys (made once)


def installed() -> bool:
    return _State.torch_init is not None


def install() -> bool:
    """Put nbdist's functions in ``torch.distributed`` (unless switched off); True if they are."""
    if installed():
        return True
    if not switched_on(FLAG):
        return False
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    _State.torch_init, _State.torch_destroy = c10d.init_process_group, c10d.destroy_process_group
    _State.signature = inspect.signature(_State.torch_init)
    for module in (dist, c10d):
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group
    return True


def torch_init(*args: Any, **kwargs: Any) -> Any:
    """torch's own ``init_process_group`` (for the groups nbdist makes itself)."""
    if _State.torch_init is not None:
        return _State.torch_init(*args, **kwargs)
    import torch.distributed as dist

    return dist.init_process_group(*args, **kwargs)


def attach(member: Membership, own_group: Any = None) -> None:
    """This process is now ``member`` of a world; ``own_group``: the default group the world
    made (or None). Each world starts its own generations."""
    _State.member, _State.own_group = member, own_group
    _State.base, _State.generations, _State.said, _State.borrowed = None, {}, False, False


def detach() -> None:
    """The world ends here: a default group user code made in it and left is ended (kept
    alive, as any), and torch's functions behave as torch's again."""
    if _State.made:
        destroy_own()
    close = getattr(_State.base, "close", None)  # a host world's store: its sockets end here
    if close is not None:
        close()
    _State.member = _State.own_group = _State.base = None
    _State.borrowed = False


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
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    graveyard.bury(_world_groups(group), max(_State.timeout, _member_timeout()))
    if _State.torch_destroy is not None:
        _State.torch_destroy(group)
    else:
        dist.destroy_process_group(group)
    if group is None or group is dist.group.WORLD or not dist.is_initialized():
        _State.made = False
        if _State.excepthook is not None:
            sys.excepthook, _State.excepthook = _State.excepthook, None


def _member_timeout() -> float:
    return _State.member.timeout if _State.member is not None else 1800.0


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """torch's ``init_process_group``; in a world, through the world's store (module doc)."""
    member = _State.member
    assert _State.signature is not None
    if member is None:
        return _State.torch_init(*args, **kwargs)
    import torch.distributed as dist

    bound = _State.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a["store"] is not None:  # the user made a store: theirs to keep
        return _State.torch_init(**a)
    size = member.world_size if a["world_size"] in (None, -1) else int(a["world_size"])
    rank = member.rank if a["rank"] in (None, -1) else int(a["rank"])
    _check(member, rank, size)
    if dist.is_initialized() and _State.own_group is not None \
            and dist.group.WORLD is _State.own_group:
        _borrow(member, a["backend"], size)
        return None
    if dist.is_initialized():  # the user's own group, still up: torch's "twice" error
        return _State.torch_init(**a)
    graveyard.release()
    gen = _State.generations.get(size, 0) + 1
    if _State.base is None:
        _State.base = member.store()
    store = _Recorded(dist.PrefixStore(f"{_PREFIX}/{size}/{gen}/", _State.base))
    timeout = a["timeout"] or timedelta(seconds=member.timeout)
    _say_once(member, a["init_method"])
    hook = sys.excepthook
    _name_first_group()
    a.update(init_method=None, store=store, rank=rank, world_size=size, timeout=timeout)
    try:
        _State.torch_init(**a)
    except Exception as exc:
        store.forget()  # the next try meets the others under the same generation
        raise _explain(exc, member, rank, size, timeout) from exc
    _State.generations[size] = gen
    _State.made = True
    _State.excepthook, _State.timeout = hook, timeout.total_seconds()
    return None


def destroy_process_group(group: Any = None) -> None:
    """torch's ``destroy_process_group``; the groups it ends are freed only once that is safe;
    the world's own group is left to the world."""
    import torch.distributed as dist

    if _State.member is None and _State.torch_destroy is not None and not dist.is_initialized():
        return _State.torch_destroy(group)
    if (group is None or group is dist.group.WORLD) and _State.own_group is not None \
            and dist.group.WORLD is _State.own_group:
        _State.borrowed = False  # the user's part ends; the world's group stays
        return None
    graveyard.release()
    destroy_own(group)
    return None


def _name_first_group() -> None:
    """torch names a default group by a per-process count that only a destroy resets; one a
    failed attempt left raised would give this rank other keys than its peers'."""
    if torch_private.usable("process_group"):
        from torch.distributed import distributed_c10d as c10d

        c10d._world.group_count = 0


def _recorded_store_class() -> type:
    import torch.distributed as dist

    class Recorded(dist.Store):
        """A group's store that remembers the keys this rank wrote, so a failed attempt can
        take them back: a rank that comes later must not read a dead listener's address."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.written = inner, set()

        def set(self, key: str, value: Any) -> None:
            self.written.add(key)
            self.inner.set(key, value)

        def add(self, key: str, amount: int) -> int:
            self.written.add(key)
            return self.inner.add(key, amount)

        def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
            self.written.add(key)
            return self.inner.compare_set(key, expected, desired)

        def get(self, key: str) -> Any:
            return self.inner.get(key)

        def wait(self, keys: list[str], *timeout: Any) -> None:
            self.inner.wait(keys, *timeout)

        def check(self, keys: list[str]) -> bool:
            return self.inner.check(keys)

        def num_keys(self) -> int:
            return self.inner.num_keys()

        def delete_key(self, key: str) -> bool:
            self.written.discard(key)
            return self.inner.delete_key(key)

        def set_timeout(self, timeout: timedelta) -> None:
            self.inner.set_timeout(timeout)

        def forget(self) -> None:
            for key in list(self.written):
                try:
                    self.inner.delete_key(key)
                except Exception:  # noqa: BLE001 - the store went with the world
                    pass
            self.written.clear()

    return Recorded


def _Recorded(inner: Any) -> Any:  # noqa: N802 - makes the class on first use (torch import)
    if _State.recorded is None:
        _State.recorded = _recorded_store_class()
    return _State.recorded(inner)


def _check(member: Membership, rank: int, size: int) -> None:
    """ValueError, naming both, for a rank or size this world cannot give this process."""
    here = f"rank {member.rank} ({member.name}) of this nbdist world of {member.world_size}"
    if rank != member.rank:
        raise ValueError(f"init_process_group(rank={rank}) was called on {here}: each process "
                         f"of the world is one rank, so here rank must be {member.rank} "
                         "(leave it out, or pass int(os.environ['RANK']))")
    if size > member.world_size:
        raise ValueError(f"init_process_group(world_size={size}) was called on {here}: a group "
                         f"of {size} needs {size} ranks; `%dist_restart {size - 1} --keep` "
                         f"makes a world of {size} (the notebook and {size - 1} workers)")
    if size < 1 or rank >= size:
        raise ValueError(f"init_process_group(rank={rank}, world_size={size}) was called on "
                         f"{here}: rank {rank} is not in a group of {size}; call it on ranks "
                         f"0..{size - 1} only")


def _borrow(member: Membership, backend: Any, size: int) -> None:
    """The world already made the default group: a matching call uses it."""
    wanted = str(backend).lower() if backend is not None else None
    if size != member.world_size:
        raise ValueError(f"init_process_group(world_size={size}) on rank {member.rank}: this "
                         f"world already has a default process group of {member.world_size} "
                         f"ranks ({member.why}); use it as it is (leave world_size out), or "
                         "restart the world without it to make groups of other sizes")
    if wanted is not None and member.backend is not None and member.backend not in wanted:
        raise ValueError(f"init_process_group({wanted!r}) on rank {member.rank}: this world's "
                         f"default process group is {member.backend} ({member.why}); ask for "
                         f"{member.backend!r}, or `%dist_restart --process-group {wanted}`")
    if not _State.borrowed and member.rank == 0 and not _State.said:
        _State.said = True
        print(f"nbdist: init_process_group uses this world's own process group "
              f"({member.why}); destroy_process_group() leaves it be", file=sys.stderr)
    _State.borrowed = True


def _say_once(member: Membership, init_method: Any) -> None:
    if member.rank != 0 or _State.said:
        return
    _State.said = True
    how = f"init_method={init_method!r}" if init_method else "env://"
    print(f"nbdist: init_process_group joins this world's private rendezvous instead of "
          f"{how}: no port is opened, MASTER_ADDR/MASTER_PORT are not used", file=sys.stderr)


def _explain(exc: Exception, member: Membership, rank: int, size: int,
             timeout: timedelta) -> Exception:
    """A rendezvous that timed out says which rank waited, and for what."""
    text = str(exc)
    if "imeout" not in text and "timed out" not in text.lower():
        return exc
    from ..errors import DistTimeoutError

    others = [str(r) for r in range(size) if r != rank]
    who = f"rank{'s' if len(others) > 1 else ''} {', '.join(others)}"
    return DistTimeoutError(
        f"rank {rank} ({member.name}) waited {timeout.total_seconds():g}s in "
        f"init_process_group for {who} to join a group of {size}: every rank "
        f"0..{size - 1} must call it (from the notebook, `%%dist --local` runs a cell on all "
        f"ranks at once)")
