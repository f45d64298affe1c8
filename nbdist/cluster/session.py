"""What the notebook process keeps between worlds, in one object: the warm template, the
runtime directory, the join agents, the counters worlds draw from, and the world started last
with its spec (``core`` sets them; ``%dist_restart`` repeats the spec).

At interpreter exit it runs ``before_exit`` (``core`` calls off a heal under way, while the
template still reports its workers' exits), removes the runtime directory, stops the template
(which SIGKILLs every worker it forked), then runs ``on_exit`` (``core`` stops the current
world); displays' exit handlers, registered later, run before it. Prewarm (``%load_ext nbdist``,
or ``import nbdist`` in a Jupyter kernel; ``Session.prewarm`` returns at once) launches the
template, which imports torch in its own process, and imports torch's RPC here on the
``Warmup`` thread; ``NBDIST_PREWARM=0`` turns it off. The template exits with the notebook,
or after ``NBDIST_TEMPLATE_IDLE`` seconds (default 600) without workers.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..envflag import switched_on
from ..errors import StartError
from ..hosts.host_agents import HostAgent
from ..hosts.launch import Template
from ..hosts.netif import Interface
from ..hosts.scheduler import Allocation
from ..proc.runtime import runtime_dir
from ..spec import WorldSpec
from ..thread_raise import raise_in
from .warmup import Warmup

__all__ = ["PREWARM_ENV", "Session", "prewarm_enabled", "session"]

PREWARM_ENV = "NBDIST_PREWARM"


def prewarm_enabled() -> bool:
    """Whether the template may be started before the first world (``NBDIST_PREWARM``)."""
    return switched_on(PREWARM_ENV)


class Session:
    """Everything nbdist keeps per notebook process between worlds."""

    def __init__(self) -> None:
        self.template: Template | None = None
        self.runtime_dir: str | None = None
        self.exec_ids = itertools.count(1)  # cells and flush tokens, unique per process
        self.epochs = itertools.count(1)  # one per world: keeps RRef ids of worlds apart
        self.joiner: threading.Thread | None = None  # rank 0's init_rpc of a failed start
        self.agents: dict[tuple, HostAgent] = {}  # join agents on other hosts, kept warm
        self.agent_key = os.urandom(32)  # the secret agents prove (reaches them on stdin)
        self.warned_data_plane = False
        self.allocation: Allocation | None = None  # --slurm's job, --ray's placement group
        self.follower: Any = None  # its time-left warner (``allocation.Follower``)
        self.before_exit: list[Callable[[], None]] = []  # run first at exit, in order
        self.on_exit: list[Callable[[], None]] = []  # run last at exit, in order
        self.warmup = Warmup()  # torch's RPC imported here in the background
        self.latest: Any = None  # the world started last (``core.Cluster``), stopped or not
        self.last_spec: WorldSpec | None = None  # what the last start asked for (restart's)

    def settle_joiner(self, deadline: float) -> None:
        """Before a new ``init_rpc``: let a failed start's joining thread end (it is bounded
        by that start's deadline); a new one must not run beside it."""
        from ..patches import rpc_hooks

        joiner, self.joiner = self.joiner, None
        if joiner is None:
            return
        while joiner.is_alive() and time.monotonic() < deadline:
            rpc_hooks.release_gathers()  # it may have reached init_rpc's last gather since
            if _abandon_in_gloo(joiner):  # a daemon thread: it ends when Gloo gives up
                return
            joiner.join(min(0.1, max(deadline - time.monotonic(), 0)))
        if joiner.is_alive():
            self.joiner = joiner
            raise StartError("rank 0 is still inside init_rpc from the previous start, which "
                             "failed; it ends by that start's deadline: try again then")
        _drop_late_agent()

    def runtime(self) -> str:
        """This process's private runtime directory, made on first use."""
        if self.runtime_dir is None or not os.path.isdir(self.runtime_dir):
            self.runtime_dir = runtime_dir()
        return self.runtime_dir

    def get_template(self) -> Template:
        """The warm template (started by ``ensure_started``; survives worlds)."""
        if self.template is None:
            self.template = Template(self.runtime())
        return self.template

    def agents_for(self, spec: WorldSpec, iface: Interface) -> list[HostAgent]:
        """One agent per host of ``spec`` (the running one when it matches; an agent with
        other settings for the same host is closed first)."""
        python = spec.remote_python or sys.executable
        chosen = []
        for host, _ in spec.hosts:
            key = (host, spec.launcher, python, iface)
            for other in [k for k in self.agents if k[0] == host and k != key]:
                self.agents.pop(other).close(timeout=2.0)
            agent = self.agents.get(key)
            if agent is None:
                start = self.allocation.starter() \
                    if self.allocation is not None and spec.scheduled else None
                agent = self.agents[key] = HostAgent(host, spec.launcher, python, iface, start)
            chosen.append(agent)
        return chosen

    def close_agents(self) -> int:
        """End every join agent (each kills its ranks) and give back the scheduler's
        allocation they ran in, if any; returns how many agents there were."""
        agents, self.agents = list(self.agents.values()), {}
        for agent in agents:
            agent.close(timeout=2.0)
        self.release_allocation()
        return len(agents)

    def release_allocation(self) -> bool:
        """Give back the scheduler's allocation (``--slurm``, ``--ray``); True if there was
        one."""
        follower, self.follower = self.follower, None
        if follower is not None:
            follower.stop()
        job, self.allocation = self.allocation, None
        if job is None:
            return False
        job.release()
        return True

    def prewarm(self, import_here: bool = True) -> bool:
        """Launch the warm template and import torch's RPC here in the background (returns
        at once) unless ``NBDIST_PREWARM=0``; True when the template is starting or running.
        ``import_here=False``: the template only (``warmup.start()`` begins the import)."""
        if not prewarm_enabled():
            return False
        try:
            self.get_template().ensure_started()
        except Exception as exc:  # noqa: BLE001 - %dist_start will try again and say why
            print(f"nbdist: could not prewarm the worker template: {exc}", file=sys.stderr)
            return False
        if import_here:
            self.warmup.start()  # rank 0 needs torch too: at the same time
        return True

    def template_pid(self) -> int | None:
        t = self.template
        return t.pid if t is not None and t.alive() else None

    def at_exit(self) -> None:
        """Quick on purpose: Jupyter gives a kernel a few seconds to exit before it kills it."""
        for hook in self.before_exit:
            hook()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        try:
            for agent in self.agents.values():
                agent.close(timeout=1.0)
            self.release_allocation()
            if self.template is not None:
                self.template.close(timeout=2.0)
            self.warmup.close(timeout=1.0)  # an import under way: a moment to end
        finally:
            for hook in self.on_exit:
                hook()


class _WorldGone(BaseException):
    """Raised in a failed start's joining thread the moment Gloo gives it back."""


#: Where torch's ``init_rpc`` waits on its Gloo group's connections: as it builds the group
#: (Gloo's full mesh) or in the group's first collective, the device maps' all-gather (a lazy
#: group, ``proc.lazy_gloo``, connects its pairs there). Nothing of RPC's process-wide state
#: is set yet in either, so a call stopped on its return leaves none behind.
_BACKEND_REGISTRY = "torch/distributed/rpc/backend_registry.py"
_BEFORE_AGENT = ("_init_process_group", "_tensorpipe_exchange_and_check_all_device_maps")


def _abandon_in_gloo(joiner: threading.Thread) -> bool:
    """If ``joiner`` (a failed start's ``init_rpc``) waits inside Gloo's connect to its
    world's ranks, which are gone, make it stop the moment that returns, and say so.

    Gloo retries a refused connect to each dead peer in turn, each for the whole timeout:
    a rank killed while rank 0 joined a heal's world kept that thread there past the next
    start's deadline (issue 45, seed 6). The call holds only its own store and group, and
    the pending exception fires at its next Python instruction, before the RPC agent or any
    of RPC's globals are set, so the next ``init_rpc`` need not wait for it. The thread is
    there when the innermost of its frames in torch's backend registry is one of
    ``_BEFORE_AGENT`` (a lazy group waits below the all-gather's, in ``distributed_c10d``)."""
    from ..patches.torch_private import usable

    if not usable("restart"):
        return False
    frame = sys._current_frames().get(joiner.ident or -1)
    while frame is not None and not frame.f_code.co_filename.replace(
            os.sep, "/").endswith(_BACKEND_REGISTRY):
        frame = frame.f_back
    if frame is None or frame.f_code.co_name not in _BEFORE_AGENT:
        return False
    return raise_in(joiner.ident, _WorldGone)


def _drop_late_agent() -> None:
    """A failed start's ``init_rpc`` that ended after its world was torn down may have set
    an RPC agent (torch sets it before its last all-gather with the peers, which were gone):
    shut it and RPC's counters down, else the next ``init_rpc`` meets "RPC is already
    initialized" (issue 45: a rank killed while rank 0 joined a heal's world)."""
    import torch.distributed.rpc as rpc

    from ..patches import rpc_hooks

    try:
        rpc.shutdown(graceful=False)
    except Exception:  # noqa: BLE001 - none was set: nothing to drop
        return
    rpc_hooks.reset_world_state()


def session() -> Session:
    """The notebook process's one ``Session``."""
    return _SESSION_PER_PROCESS


_SESSION_PER_PROCESS = Session()
atexit.register(_SESSION_PER_PROCESS.at_exit)

