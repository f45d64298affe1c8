"""The one lifecycle state of a ``Cluster`` and the moves between its states."""

from __future__ import annotations

import enum

from ..errors import ClusterStateError

__all__ = ["MOVES", "ClusterState"]


class ClusterState(enum.Enum):
    """Where a world is in its life; ``MOVES`` below is every move it may make, and
    ``moved_to`` the one way to make one. The ``Cluster``'s lifecycle lock decides every
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

    def moved_to(self, new: ClusterState) -> ClusterState:
        """``new``, if ``MOVES`` lets a world go there from this state; else
        ``ClusterStateError`` naming both and where this state may go."""
        if new not in MOVES[self]:
            where = " or ".join(s.value for s in _ORDER if s in MOVES[self]) or "nowhere"
            raise ClusterStateError(f"a world cannot go from {self.value} to {new.value}: "
                                    f"from {self.value} it goes {where}")
        return new

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

#: Every move a world may make: start (NEW → STARTING → RUNNING), a rebuild in place
#: (RUNNING → HEALING, RESTARTING or GROWING → RUNNING) and teardown (from any state but
#: STOPPED → STOPPING → STOPPED; a failed start or rebuild stops the world).
MOVES: dict[ClusterState, frozenset[ClusterState]] = {
    ClusterState.NEW: frozenset({ClusterState.STARTING, ClusterState.STOPPING}),
    ClusterState.STARTING: frozenset({ClusterState.RUNNING, ClusterState.STOPPING}),
    ClusterState.RUNNING: frozenset({ClusterState.HEALING, ClusterState.RESTARTING,
                                     ClusterState.GROWING, ClusterState.STOPPING}),
    ClusterState.HEALING: frozenset({ClusterState.RUNNING, ClusterState.STOPPING}),
    ClusterState.RESTARTING: frozenset({ClusterState.RUNNING, ClusterState.STOPPING}),
    ClusterState.GROWING: frozenset({ClusterState.RUNNING, ClusterState.STOPPING}),
    ClusterState.STOPPING: frozenset({ClusterState.STOPPED}),
    ClusterState.STOPPED: frozenset(),
}
_ORDER = tuple(ClusterState)
