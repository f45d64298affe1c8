"""What a world asks of a batch scheduler (SLURM now; another one is another module).

An ``Allocation`` is one request for nodes, from submission to release: ``request`` submits
it (the user's own options, passed through), ``wait`` follows it while it is pending (each
state shown through a callback) until it runs, ``nodes`` says what it holds on each node
(``NodeShare``), ``launcher`` is the ``--launcher`` template that starts a join agent on one
of its nodes without holding the node's CPUs or GPUs, ``state`` and ``time_left`` follow its
life, and ``release`` gives it back (and nothing of it stays queued). A scheduler lives in one
module that implements this interface and also answers for the allocation the notebook already
runs in (``enclosing_hosts``: ``--hosts slurm``; ``STEP_LAUNCHER``: ``--launcher srun``).
``hosts.slurm`` is the one so far; the rest of nbdist reaches it only through
``hosts.scheduler``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Allocation", "JobState", "NodeShare"]


@dataclass(frozen=True)
class NodeShare:
    """What an allocation holds on one node, and how many ranks run there."""

    host: str
    ranks: int
    cpus: int  # the allocation's CPUs on the node
    cpus_per_task: int | None = None  # asked for explicitly (``-c``), else None
    gpus: tuple[int, ...] = field(default=())  # the allocated GPUs' indices, as the node sees

    def threads(self) -> int:
        """Threads for each rank here: the CPUs per task asked for, else the node's
        allocated CPUs over its ranks (at least one)."""
        if self.cpus_per_task:
            return self.cpus_per_task
        return max(1, self.cpus // max(self.ranks, 1))

    def gpus_of(self, local: int) -> tuple[int, ...]:
        """The GPUs of the ``local``-th rank of this node (0-based): its own share when there
        are at least as many GPUs as ranks, else one shared round robin; () without GPUs."""
        if not self.gpus:
            return ()
        per = len(self.gpus) // max(self.ranks, 1)
        if per >= 1:
            return self.gpus[local * per:(local + 1) * per]
        return (self.gpus[local % len(self.gpus)],)


@dataclass(frozen=True)
class JobState:
    """A scheduler's word for a job's state, its reason, and its time left (None: no limit
    or not known)."""

    state: str
    reason: str = ""
    time_left: float | None = None
    time_limit: str = ""

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def ended(self) -> bool:
        """It will not run (again): not pending, not running, and known."""
        return not (self.pending or self.running or self.state in ("UNKNOWN", "NONE"))


class Allocation(Protocol):
    """One allocation of nodes from a scheduler (see the module's docstring)."""

    options: str
    job_id: str | None
    what: str  # how the scheduler calls it: "SLURM job", "Ray placement group"

    def request(self) -> str:
        """Submit; returns the job id. ValueError with the scheduler's words if refused."""

    def wait(self, deadline: float, show: Callable[[JobState, float], None]) -> None:
        """Until the allocation runs; ``show(state, waited)`` while it is pending. Raises
        StartError if it can never run or ended, DistTimeoutError at ``deadline``."""

    def nodes(self) -> list[NodeShare]:
        """Every node it holds, in order."""

    def launcher(self) -> str:
        """A launcher template (``{host}``, ``{command}``) that runs inside the allocation."""

    def state(self) -> JobState:
        """Its state now (ask the scheduler)."""

    def release(self) -> None:
        """Give it back, whatever its state; idempotent."""

    def describe_end(self, state: JobState) -> str:
        """Why it ended, in the scheduler's words and ours."""

    def starter(self) -> Callable[..., Any] | None:
        """How the scheduler starts a join agent itself (Ray: an actor), as
        ``start(host, argv, request, on_stderr)`` returning a ``Popen``-like handle; None: the
        ``launcher`` template does."""

    def local_address(self) -> str | None:
        """This machine's address as the scheduler knows it (the agents reach the notebook
        there); None: the default route's interface."""

    def placed(self) -> str:
        """What ``%dist_status --hosts`` adds about where each host runs ("" for nothing)."""

    def lost_why(self, host: str) -> str | None:
        """The scheduler's reason a host's agent was lost (a node it reports dead), asked
        for a moment; None when it has none."""
