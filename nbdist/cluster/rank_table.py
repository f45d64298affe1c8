"""The one lifecycle state of a ``Cluster``."""

from __future__ import annotations

import enum

from ..errors import ClusterStateError

__all__ = ["ClusterState"]


class ClusterState(enum.Enum):
    """Where a world is in its life. Moves: NEW → STARTING → RUNNING; RUNNING → HEALING,
    RESTARTING or GROWING (a keep-restart, rebuilt in place) → RUNNING; any → STOPPING →
    STOPPED. A failed rebuild stops the world. The ``Cluster``'s lifecycle lock decides every
    move; docs/guide/when-a-rank-dies.md says what each command does in each state."""

    NEW = "new"  # made, nothing started yet
    STARTING = "starting"  # workers forking, connecting, joining the RPC world
    RUNNING = "running"  # every rank answered; cells and RPCs may run
    HEALING = "healing"  # --heal rebuilds the world around a dead rank's replacement
    RESTARTING = "restarting"  # `%dist_restart --keep` rebuilds it, same size
    GROWING = "growing"  # `%dist_restart N --keep` rebuilds it larger or smaller
    STOPPING = "stopping"  # teardown under way: nothing new is accepted
    STOPPED = "stopped"  # everything it started is gone

    @property
    def live(self) -> bool:
        """Its ranks run and it is the process's world: running or rebuilt in place."""
        return self in _LIVE

    def require(self, *allowed: ClusterState, doing: str) -> None:
        """Raise ``ClusterStateError`` unless the state is one of ``allowed``."""
        if self not in allowed:
            hint = {ClusterState.STOPPED: "; start one with `%dist_start N`",
                     ClusterState.STOPPING: "; it is stopping",
                     ClusterState.STARTING: "; it is still starting",
                     ClusterState.HEALING: "; --heal is replacing a rank",
                     ClusterState.RESTARTING: "; a keep-restart is under way",
                     ClusterState.GROWING: "; a keep-restart is resizing it"}.get(self, "")
            raise ClusterStateError(f"cannot {doing}: this world is {self.value}{hint}")


_LIVE = frozenset({ClusterState.RUNNING, ClusterState.HEALING, ClusterState.RESTARTING,
                   ClusterState.GROWING})
