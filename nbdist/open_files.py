"""Enough open files for a world in the notebook's process, checked before anything starts.

Rank 0 talks to every peer, so it holds descriptors per peer: measured on torch 2.15, about
57 a peer over TensorPipe's shared-memory transport (ring buffers, event fds: 992 in a
16-rank world) and about 9.5 over TCP (699 at 64 ranks, 2,424 at 256), beside some 140 of
its own; a worker holds under 200 at 256 ranks. A soft limit of 1,024 (many desktops'
default) is then spent by a 16-rank world or a 100-rank one. ``ensure`` raises the soft
limit up to the hard one, as a process may, and where the hard limit is too low says so
before any rank starts.
"""

from __future__ import annotations

import resource

__all__ = ["BASE", "PER_PEER", "ensure", "needed"]

BASE = 256  # the notebook's own files (kernel sockets, torch, the control listener), room kept
PER_PEER = {"shm": 72, "tcp": 14}  # the measured 57 and 9.5, with room


def needed(world_size: int, shm: bool) -> int:
    """Open files rank 0 of a ``world_size``-rank world may hold (``shm``: TensorPipe's
    shared-memory transport between local ranks, else TCP)."""
    return BASE + PER_PEER["shm" if shm else "tcp"] * max(world_size - 1, 0)


def ensure(world_size: int, shm: bool) -> int | None:
    """Raise this process's soft limit on open files to what the world needs, within the hard
    limit; the new soft limit, or None if it already sufficed. ``ValueError`` (nothing
    changed) if the hard limit is lower than the need."""
    want = needed(world_size, shm)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return None
    if hard != resource.RLIM_INFINITY and hard < want:
        per = PER_PEER["shm" if shm else "tcp"]
        how = "shared memory" if shm else "TCP"
        raise ValueError(
            f"a world of {world_size} ranks needs about {want:,} open files in this process "
            f"(rank 0 keeps about {per} per peer over {how}), "
            f"and this process may open at most {hard:,} (`ulimit -Hn`). Raise the hard "
            "limit (limits.conf, or LimitNOFILE= for a service) and restart the kernel, or "
            f"start at most {max((hard - BASE) // per, 0)} workers"
            + (" (or use `--rpc-transport tcp`)" if shm else ""))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want
