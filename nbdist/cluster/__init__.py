"""One local RPC world with the notebook as rank 0: the session, start-up, the receiver,
cells, status and stop. ``Cluster`` is the facade; ``start``/``current``/``stop`` the entry."""

from .core import Cluster, current, release_hosts, restart, start, stop

__all__ = ["Cluster", "current", "release_hosts", "restart", "start", "stop"]
