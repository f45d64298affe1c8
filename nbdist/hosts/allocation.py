"""A world's nodes from a scheduler: ``--slurm`` or ``--ray`` made into hosts, kept across
worlds.

``provide(spec, keeper)`` returns ``spec`` with the hosts, launcher and interface of the
allocation ``keeper`` holds (``cluster.session.Session``, handed in from above): the running
one when its options match, else a new one (submitted, followed with a live line while
pending, cancelled on Ctrl-C, on the start timeout or on any error, so nothing stays queued).
An allocation that ended (TIMEOUT, CANCELLED, NODE_FAIL, ...) is replaced by a new one with
the same options, and one line says so. ``Follower`` warns the
running cell once when ``NBDIST_SLURM_WARN`` minutes (5) are left. ``release`` gives the
allocation back (``%dist_stop --hosts``, ``nbdist.release_hosts()``, interpreter exit; a
SIGKILL of this process is covered by the allocation's own watchdog). The other functions
read the allocation they are given (None: there is none).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Any, Protocol

from ..output.router import Router, StatusLine
from ..spec import WorldSpec
from . import netif
from .scheduler import Allocation, JobState, NodeShare, new_allocation

__all__ = ["WARN_ENV", "Follower", "Keeper", "describe", "ended", "lost_why", "provide",
           "rank_shares", "release", "remote_devices", "shares"]

_COMPLETING = 15.0  # seconds to wait for a job's end to be named (KillWait, epilogs)
WARN_ENV = "NBDIST_SLURM_WARN"  # minutes left when the running cell is warned (default 5)


class Keeper(Protocol):
    """What keeps a scheduler's allocation across worlds (``cluster.session.Session``)."""

    allocation: Allocation | None  # --slurm's job, --ray's placement group
    follower: Any  # its time-left warner (``Follower``)

    def close_agents(self) -> int:
        """End the join agents (they ran in the allocation) and give the allocation back."""
        ...

    def release_allocation(self) -> bool:
        """Give the allocation back; True if there was one."""
        ...


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "no time limit"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def provide(spec: WorldSpec, keeper: Keeper, quiet: bool = False) -> WorldSpec:
    """``spec`` placed on ``keeper``'s allocation (see the module); ``spec`` itself without
    ``--slurm`` or ``--ray``."""
    kind, options = spec.scheduled, spec.scheduler_options
    if kind is None or options is None:
        return spec
    job = keeper.allocation
    if job is not None and _same(job, kind, options) and job.job_id is not None:
        state = job.state()
        if state.running:
            return _placed(spec, job)
        if state.ended and not quiet:
            print(f"nbdist: {job.what} {job.job_id} ended: {job.describe_end(state)}; asking "
                  "for a new allocation with the same options")
    if job is not None:
        keeper.close_agents()  # the agents ran in it: they end as it is given back
    job = new_allocation(kind, options)
    keeper.allocation = job
    status = StatusLine()
    try:
        job.request()
        job.wait(time.monotonic() + spec.start_seconds(),
                 lambda st, waited: status.show(_pending_line(job, st, waited)))
        job.nodes()
    except BaseException:
        release(keeper)
        status.done(f"nbdist: {job.what} {job.job_id or '-'} cancelled")
        raise
    status.done(f"nbdist: {job.what} {job.job_id} RUNNING on "
                + ", ".join(s.host for s in job.nodes()), always=True)  # where it runs, always
    keeper.follower = Follower(job)
    return _placed(spec, job)


def _same(job: Allocation, kind: str, options: str) -> bool:
    return job.options == options and (job.what == "Ray placement group") == (kind == "ray")


def _pending_line(job: Allocation, state: JobState, waited: float) -> str:
    reason = f" ({state.reason})" if state.reason and state.reason not in ("None",
                                                                            state.state) else ""
    return (f"nbdist: {job.what} {job.job_id} {state.state}{reason}, waited {waited:.0f}s "
            "(Ctrl-C cancels it)")


def _placed(spec: WorldSpec, job: Allocation) -> WorldSpec:
    hosts = tuple((s.host, s.ranks) for s in job.nodes())
    iface = spec.iface or job.local_address()
    if not iface:
        default = netif.default_interface()
        if default is None:
            raise ValueError(f"--{spec.scheduled}: this machine has no default route, so give "
                             "--iface: its interface or address that the nodes reach")
        iface = default.name
    return replace(spec, hosts=hosts, launcher=job.launcher(), iface=iface).validate()


def shares(spec: WorldSpec, job: Allocation | None) -> dict:
    """host -> ``NodeShare`` of allocation ``job``, for a ``--slurm``/``--ray`` world."""
    if not spec.scheduled or job is None or job.job_id is None:
        return {}
    return {s.host: s for s in job.nodes()}


def rank_shares(spec: WorldSpec, job: Allocation | None) -> dict[int, tuple[NodeShare, int]]:
    """rank -> (its node's ``NodeShare``, its index among that node's ranks), for the ranks
    of a ``--slurm`` world on the allocation's nodes."""
    by_host, seen, out = shares(spec, job), {}, {}
    for rank, host in enumerate(spec.placement()):
        if host in by_host:
            seen[host] = seen.get(host, -1) + 1
            out[rank] = (by_host[host], seen[host])
    return out


def remote_devices(spec: WorldSpec, job: Allocation | None) -> tuple[tuple[str, int | None], ...]:
    """``(host, GPU index)`` of each rank on the allocation's nodes, in rank order: rank k
    of a node owns its k-th share of the node's allocated GPUs (``devices.setup``'s
    ``remote``); () outside ``--slurm``."""
    return tuple((share.host, (share.gpus_of(k) or (None,))[0])
                 for _, (share, k) in sorted(rank_shares(spec, job).items()))


def ended(spec: WorldSpec, job: Allocation | None) -> str | None:
    """``SLURM job 12 ended: TIMEOUT (...)`` when ``spec``'s allocation ``job`` has ended, else
    None."""
    if not spec.scheduled or job is None or job.job_id is None:
        return None
    state = job.state()
    deadline = time.monotonic() + _COMPLETING
    while state.state == "COMPLETING" and time.monotonic() < deadline:
        time.sleep(0.2)  # SLURM names the end (CANCELLED, TIMEOUT...) once it completed
        state = job.state()
    return f"{job.what} {job.job_id} ended: {job.describe_end(state)}" if state.ended else None


def lost_why(spec: WorldSpec, host: str, job: Allocation | None) -> str | None:
    """The scheduler's reason (``job``'s) ``host``'s agent was lost (Ray: its node's death),
    or None."""
    if not spec.scheduled or job is None or job.job_id is None:
        return None
    return job.lost_why(host)


def describe(job: Allocation | None) -> str:
    """One line for ``%dist_status --hosts``: the job, its state and time left."""
    if job is None or job.job_id is None:
        return ""
    state = job.state()
    left = f", {_clock(state.time_left)} left" if state.running and state.time_left else ""
    limit = f" (time limit {state.time_limit})" if state.time_limit else ""
    flag = "--ray" if job.what.startswith("Ray") else "--slurm"
    where = job.placed()
    return (f"{job.what} {job.job_id}: {state.state}{left}{limit}{where}; "
            f"{flag} {job.options!r}")


def release(keeper: Keeper) -> bool:
    """Give ``keeper``'s allocation back (cancel it); True if there was one."""
    return keeper.release_allocation()


class Follower:
    """Warns the running cell once when the allocation's time left falls under
    ``NBDIST_SLURM_WARN`` minutes; asks SLURM at most every 30 s (its own thread, stopped by
    ``release``)."""

    def __init__(self, job: Allocation) -> None:
        self.job = job
        self.warn = float(os.environ.get(WARN_ENV, "5")) * 60
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbdist-slurm-follower",
                                         daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = 0.0
        while not self._stop.wait(pause):
            state = self.job.state()
            if state.ended:
                return
            left = state.time_left
            if left is not None and left <= self.warn:
                Router.write("stderr", f"nbdist: SLURM job {self.job.job_id} has "
                                       f"{_clock(left)} left (time limit {state.time_limit}); "
                                       "its ranks end with it: save what you need\n")
                return
            pause = 30.0 if left is None else min(max(left - self.warn, 0.5), 30.0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
