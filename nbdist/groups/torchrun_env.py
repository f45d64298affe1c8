"""torchrun's environment variables on every rank of a world, the notebook included.

torchrun-style code reads ``int(os.environ["RANK"])`` and the like. Each worker gets them in
its environment when it starts, and again when a keep-restart gives it a new world; the
notebook (rank 0) gets them for the world's life (``enter``), and at the end (``leave``)
every one of them goes back to what it was before, one that was absent is removed.
``MASTER_ADDR``/``MASTER_PORT`` (``master``) name rank 0's address and a port free there when
the world starts (below the ephemeral range, so no rank's own socket takes it later), the
same on every rank, as torchrun's do; nothing of nbdist listens there
(``init_process_group`` meets through the world's store, ``patches.process_group``), so code
that opens its own store on them finds the port free. ``NBDIST_TORCHRUN_ENV=0`` sets none.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass

from ..envflag import switched_on

__all__ = ["FLAG", "KEYS", "enter", "leave", "master", "variables"]

FLAG = "NBDIST_TORCHRUN_ENV"
KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def variables(rank: int, hosts: list[str | None]) -> dict[str, str]:
    """torchrun's variables for ``rank`` of a world whose rank r runs on ``hosts[r]`` (None:
    this machine); empty when switched off. One machine is one torchrun node (``GROUP_RANK``,
    this machine first); every rank has the one role."""
    if not switched_on(FLAG):
        return {}
    host = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == host]
    machines = list(dict.fromkeys(hosts))
    return {"RANK": str(rank), "WORLD_SIZE": str(len(hosts)),
            "LOCAL_RANK": str(local.index(rank)), "LOCAL_WORLD_SIZE": str(len(local)),
            "GROUP_RANK": str(machines.index(host)), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(len(hosts))}


def master(address: str) -> dict[str, str]:
    """``MASTER_ADDR`` (``address``: where the ranks reach rank 0) and ``MASTER_PORT``, a port
    free on it now; empty when switched off."""
    if not switched_on(FLAG):
        return {}
    return {"MASTER_ADDR": address, "MASTER_PORT": str(_free_port(address))}


def _free_port(address: str) -> int:
    """A port free on ``address`` now, below the kernel's ephemeral range where one is free:
    the system never hands such a port to a later ``bind(port 0)`` (a rank's own listening
    sockets), so it stays free for the user's store for the world's life."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    low = _ephemeral_low()
    below = range(max(1024, low - 16384), low) if low > 2048 else range(0)
    for port in random.sample(below, min(64, len(below))):
        with socket.socket(family) as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    with socket.socket(family) as s:  # none free there: any the system gives
        s.bind((address, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass
class _Saved:
    """This process's values of ``KEYS`` before its world set them (None: no world)."""

    before: dict[str, str | None] | None = None


_SAVED_PER_PROCESS = _Saved()


def enter(values: dict[str, str]) -> None:
    """This process's variables are now ``values`` (again, at a keep-restart); what it had
    before the first ``enter`` is kept for ``leave``."""
    if _SAVED_PER_PROCESS.before is None:
        _SAVED_PER_PROCESS.before = {k: os.environ.get(k) for k in KEYS}
    os.environ.update(values)


def leave() -> None:
    """Every variable ``enter`` set goes back to what it was (absent: removed)."""
    before, _SAVED_PER_PROCESS.before = _SAVED_PER_PROCESS.before, None
    for key, value in (before or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
