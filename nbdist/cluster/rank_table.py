"""The rank table of a world and the one lifecycle state of a ``Cluster``."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..control.channel import Channel
from ..errors import ClusterStateError
from ..hosts.launch import describe_exit

__all__ = ["ClusterState", "RankInfo"]


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


@dataclass
class RankInfo:
    """One rank: who it is, its process, its control channel, and how it ended."""

    rank: int
    name: str
    pid: int | None = None
    started: float = 0.0
    channel: Channel | None = None
    ready: bool = False
    exit_code: int | None = None
    failure: str | None = None
    host: str | None = None  # None: the notebook's machine
    lost: str | None = None  # why its host was lost, if it was
    device: str | None = None  # "cuda:i" where the rank runs on a GPU

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.exit_code is None

    def reason(self) -> str:
        """How it ended, in words, with the last line of a start-up traceback if any."""
        if self.lost:
            return f"lost with its host {self.host} ({self.lost})"
        text = describe_exit(self.exit_code)
        if self.failure:
            last = self.failure.strip().splitlines()[-1]
            text += f" after: {last}"
        return text

    def label(self) -> str:
        where = f" on {self.host}" if self.host else ""
        return f"rank {self.rank} ({self.name}){where}"
