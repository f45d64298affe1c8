"""Ray behind ``scheduler.Allocation``: ``--ray "OPTIONS"`` asks for one placement group.

The notebook connects to the Ray cluster it sees as a driver (``ray.init``: ``--address``,
else ``RAY_ADDRESS``, else ``auto``) and asks for a placement group of ``--nodes`` bundles,
each one node's share: ``--ranks-per-node`` ranks, ``--cpus`` and ``--gpus`` and custom
``--resources`` (JSON), placed by ``--strategy`` (SPREAD; PACK, STRICT_SPREAD, STRICT_PACK).
A join agent runs on each bundle's node as a Ray actor (``ray_agent.AgentActor``) that holds
only the bundle's GPUs, the rest staying reserved for the ranks. Hosts are named by bundle
(``bundle0``, ``bundle1``...): a bundle Ray places again on another node after its node died
keeps its ranks' host, so ``--heal`` brings them back there.

Contract: nothing outlives the notebook. The group and the actors belong to the notebook's
Ray job (never detached): Ray removes them when the driver goes, SIGKILL included; ``release``
removes them at once and disconnects.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import DistTimeoutError, StartError
from .scheduler_api import JobState, NodeShare

__all__ = ["STRATEGIES", "AgentProcess", "RayPlacement", "describe_end", "parse_options"]

STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")
_CONNECT_TIMEOUT = 60.0  # seconds ``ray.init`` may take to reach the cluster
#: Ray's placement group states, in the words ``JobState`` uses (a group re-placing the bundles
#: of a dead node still holds the others: it runs, and a relaunched agent waits for its bundle)
_STATES = {"CREATED": "RUNNING", "PENDING": "PENDING", "RESCHEDULING": "RUNNING",
           "REMOVED": "REMOVED"}
_WHY = {
    "INFEASIBLE": "no node of the cluster has a bundle's resources (an autoscaler may add one)",
    "NO_RESOURCES": "the nodes that could hold it are busy",
    "QUEUED": "queued",
    "SCHEDULING_STARTED": "being placed",
    "WAITING_FOR_NODE": "waiting for a node",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="--ray", add_help=False, exit_on_error=False)
    p.add_argument("-N", "--nodes", type=int, default=1)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--cpus", type=float, default=None)
    p.add_argument("--gpus", type=float, default=0.0)
    p.add_argument("--resources", default="{}")
    p.add_argument("--strategy", default="SPREAD")
    p.add_argument("--address", default=None)
    return p


def parse_options(options: str) -> argparse.Namespace:
    """``--ray``'s options, checked; ValueError in the flag's terms."""
    example = "e.g. --ray \"--nodes 2 --ranks-per-node 2 --cpus 2\""
    try:
        args, rest = _parser().parse_known_args(shlex.split(options))
    except (ValueError, argparse.ArgumentError) as exc:
        raise ValueError(f"--ray {options!r}: {exc}; {example}") from None
    if rest:
        raise ValueError(f"--ray {options!r}: unknown option {rest[0]!r}; the options are "
                         "--nodes, --ranks-per-node, --cpus, --gpus, --resources, --strategy, "
                         f"--address; {example}")
    if args.nodes < 1 or args.ranks_per_node < 1:
        raise ValueError(f"--ray {options!r}: --nodes and --ranks-per-node must be at least 1")
    args.strategy = args.strategy.upper()
    if args.strategy not in STRATEGIES:
        raise ValueError(f"--ray {options!r}: --strategy must be one of "
                         f"{', '.join(STRATEGIES)}, got {args.strategy!r}")
    try:
        resources = json.loads(args.resources)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--ray {options!r}: --resources must be a JSON object of numbers, "
                         f"e.g. --resources '{{\"trainer\": 1}}' ({exc})") from None
    if not isinstance(resources, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in resources.values()):
        raise ValueError(f"--ray {options!r}: --resources must be a JSON object of numbers")
    args.resources = resources
    if args.cpus is None:
        args.cpus = float(args.ranks_per_node)
    if args.cpus < 0 or args.gpus < 0:
        raise ValueError(f"--ray {options!r}: --cpus and --gpus cannot be negative")
    if args.gpus and args.gpus != int(args.gpus):
        raise ValueError(f"--ray {options!r}: --gpus per node must be whole (a rank's GPU is "
                         "a whole device)")
    return args


def describe_end(state: JobState) -> str:
    """Ray's word for a placement group's end and what it means."""
    if state.state == "REMOVED":
        return "REMOVED (the placement group was removed: `%dist_stop --hosts`, or its job ended)"
    return state.state


def _bundle_of(host: str) -> int:
    return int(host.removeprefix("bundle"))


class AgentProcess:
    """A join agent in a Ray actor, seen as the ``subprocess.Popen`` a ``HostAgent`` holds:
    ``poll``, ``wait``, ``terminate``, ``kill``, ``returncode``; its stderr, once it ended,
    goes to ``on_stderr``."""

    def __init__(self, actor: Any, on_stderr: Callable[[str], None]) -> None:
        import ray

        self.actor, self._on_stderr = actor, on_stderr
        self.returncode: int | None = None
        self.stdin = None
        self.pid = None
        self._ended = actor.wait.remote()
        self._where = actor.where.remote()
        self._ray = ray

    def where(self, timeout: float) -> dict | None:
        """Where the actor runs (None if Ray has not placed it within ``timeout``)."""
        if not self._ray.is_initialized():
            return None
        ready, _ = self._ray.wait([self._where], timeout=timeout)
        if not ready:
            return None
        try:
            return self._ray.get(self._where)
        except Exception:  # noqa: BLE001 - the actor died: the exit says why
            return None

    def _settle(self) -> None:
        try:
            code, err = self._ray.get(self._ended, timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - the actor (or its node) died
            code, err = -signal.SIGKILL, f"Ray: {_first_line(exc)}"
        self.returncode = code if code is not None else -signal.SIGKILL
        if err:
            self._on_stderr(err)

    def _gone(self) -> bool:
        """The driver disconnected (the group was given back): the actor is gone too."""
        if self.returncode is None and not self._ray.is_initialized():
            self.returncode = -signal.SIGKILL
        return self.returncode is not None

    def poll(self) -> int | None:
        if not self._gone():
            ready, _ = self._ray.wait([self._ended], timeout=0)
            if ready:
                self._settle()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._gone():
            ready, _ = self._ray.wait([self._ended], timeout=timeout)
            if not ready:
                raise subprocess.TimeoutExpired("nbdist.join (Ray actor)", timeout or 0)
            self._settle()
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        try:
            self.actor.signal.remote(signal.SIGTERM)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def kill(self) -> None:
        if not self._ray.is_initialized():
            return
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    release = kill  # the actor outlives its agent otherwise (``HostAgent.close``)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


class RayPlacement:
    """One placement group for this notebook (``scheduler.Allocation``)."""

    what = "Ray placement group"

    def __init__(self, options: str) -> None:
        self.options = options
        self.args = parse_options(options)
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ValueError("--ray needs Ray in this kernel's Python: `pip install ray` (the "
                             "nodes need it too, with nbdist and torch)") from None
        self.job_id: str | None = None
        self.pg: Any = None
        self.last: JobState | None = None
        self._connected_here = False
        self._agents: dict[str, AgentProcess] = {}  # bundle -> its agent's actor, last made
        self._lock = threading.Lock()

    # -- submit and wait -------------------------------------------------------------------
    def bundles(self) -> list[dict[str, float]]:
        a = self.args
        one = {"CPU": float(a.cpus), **{k: float(v) for k, v in a.resources.items()}}
        if a.gpus:
            one["GPU"] = float(a.gpus)
        return [dict(one) for _ in range(a.nodes)]

    def _connect(self) -> None:
        import ray

        if ray.is_initialized():
            return
        address = self.args.address or os.environ.get("RAY_ADDRESS") or "auto"
        done: list[BaseException | None] = []

        def connect() -> None:
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR,
                         namespace="nbdist")
                done.append(None)
            except BaseException as exc:  # noqa: BLE001 - told to the caller
                done.append(exc)

        worker = threading.Thread(target=connect, daemon=True, name="nbdist-ray-connect")
        worker.start()
        worker.join(_CONNECT_TIMEOUT)
        if not done:
            raise DistTimeoutError(f"--ray: Ray's cluster at {address} did not answer within "
                                   f"{_CONNECT_TIMEOUT:g}s")
        if done[0] is not None:
            raise StartError(f"--ray: could not connect to Ray at {address}: "
                             f"{_first_line(done[0])} (start the cluster with `ray start`, or "
                             "give --address or RAY_ADDRESS)") from None
        self._connected_here = True

    def request(self) -> str:
        from ray.util.placement_group import placement_group

        self._connect()
        try:
            self.pg = placement_group(self.bundles(), strategy=self.args.strategy,
                                      name=f"nbdist-{os.getpid()}-{time.time_ns()}")
        except Exception as exc:  # noqa: BLE001 - Ray's words
            raise ValueError(f"Ray refused the placement group (--ray {self.options!r}): "
                             f"{_first_line(exc)}") from None
        self.job_id = self.pg.id.hex()[:12]
        return self.job_id

    def _table(self) -> dict:
        from ray.util.placement_group import placement_group_table

        return placement_group_table(self.pg) if self.pg is not None else {}

    def state(self) -> JobState:
        if self.pg is None:
            return self.last if self.last is not None else JobState("NONE")
        try:
            table = self._table()
        except Exception:  # noqa: BLE001 - the cluster does not answer
            return JobState("UNKNOWN")
        raw = table.get("state", "UNKNOWN")
        why = (table.get("stats") or {}).get("scheduling_state", "")
        reason = f"{why}: {_WHY[why]}" if why in _WHY and raw != "CREATED" else raw
        self.last = JobState(_STATES.get(raw, raw), reason)
        return self.last

    def wait(self, deadline: float, show: Callable[[JobState, float], None]) -> None:
        import ray

        t0, pause = time.monotonic(), 0.1
        ready_ref = self.pg.ready()
        while True:
            ready, _ = ray.wait([ready_ref], timeout=pause)
            if ready:
                return
            state = self.state()
            waited = time.monotonic() - t0
            if state.ended:
                raise StartError(f"Ray placement group {self.job_id} ended before it was "
                                 f"placed: {describe_end(state)}")
            show(state, waited)
            if time.monotonic() + pause > deadline:
                raise DistTimeoutError(f"Ray placement group {self.job_id} was still "
                                       f"{state.reason} after {waited:.0f}s (--start-timeout); "
                                       "it was removed, nothing is left")
            pause = min(pause * 1.5, 1.0)

    # -- what it holds ---------------------------------------------------------------------
    def nodes(self) -> list[NodeShare]:
        a = self.args
        gpus = tuple(range(int(a.gpus)))  # as the agent's CUDA_VISIBLE_DEVICES numbers them
        return [NodeShare(f"bundle{i}", a.ranks_per_node, max(int(a.cpus), 1), None, gpus)
                for i in range(a.nodes)]

    def launcher(self) -> str:
        """Not a template (``starter`` starts the agents): names this group, so that agents
        kept from another group are never taken for its own."""
        return f"ray placement group {self.job_id}"

    def node_of(self, host: str) -> dict | None:
        """The Ray node the bundle ``host`` is placed on now (``ray.nodes()``'s entry)."""
        import ray

        try:
            node_id = self._table().get("bundles_to_node_id", {}).get(_bundle_of(host))
        except Exception:  # noqa: BLE001 - the cluster does not answer
            return None
        return next((n for n in ray.nodes() if n.get("NodeID") == node_id), None) \
            if node_id else None

    @staticmethod
    def describe_end(state: JobState) -> str:
        return describe_end(state)

    def local_address(self) -> str | None:
        """This machine's address as Ray knows it (the agents reach the notebook there)."""
        import ray

        return ray.util.get_node_ip_address() if ray.is_initialized() else None

    def placed(self) -> str:
        """``; bundle0 on Ray node 3f2a9c.. (10.0.0.2), ...`` for ``%dist_status --hosts``."""
        import ray

        try:
            where = self._table().get("bundles_to_node_id", {})
            nodes = {n["NodeID"]: n for n in ray.nodes()}
        except Exception:  # noqa: BLE001 - the cluster does not answer
            return ""
        parts = []
        for index, node_id in sorted(where.items()):
            node = nodes.get(node_id, {})
            parts.append(f"bundle{index} on Ray node {node_id[:12] or '-'}"
                         + (f" ({node.get('NodeManagerAddress')})" if node else ""))
        return "; " + ", ".join(parts) if parts else ""

    def lost_why(self, host: str) -> str | None:
        """Ray's reason for the death of the node bundle ``host`` was on (up to 2 s: Ray's
        health checks name it), None while Ray has the node alive."""
        proc = self._agents.get(host)
        where = proc.where(timeout=0.5) if proc is not None else None
        return self.node_death(where["node_id"], within=2.0) if where else None

    def node_death(self, node_id: str, within: float) -> str | None:
        """Ray's reason for the death of node ``node_id``, asked for up to ``within``
        seconds (Ray's health checks name it); None while Ray has it alive."""
        import ray

        deadline = time.monotonic() + within
        while True:
            node = next((n for n in ray.nodes() if n.get("NodeID") == node_id), None)
            if node is not None and not node.get("Alive", True):
                why = node.get("DeathReasonMessage") or "no reason given"
                return (f"Ray node {node_id[:12]} ({node.get('NodeManagerAddress')}) is dead: "
                        f"{why}")
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def start_agent(self, host: str, argv: list[str], request: str,
                    on_stderr: Callable[[str], None]) -> AgentProcess:
        """Start the join agent of bundle ``host`` as an actor in it."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .ray_agent import AgentActor

        if self.pg is None:
            raise StartError("--ray: the placement group is gone; `%dist_restart` asks for "
                             "a new one")
        actor_class = ray.remote(AgentActor)
        actor = actor_class.options(
            num_cpus=0, num_gpus=float(self.args.gpus), max_concurrency=4, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=_bundle_of(host)),
        ).remote(argv, request)
        proc = self._agents[host] = AgentProcess(actor, on_stderr)
        return proc

    def starter(self) -> Callable[..., AgentProcess]:
        """How a ``HostAgent`` starts its agent here: an actor in its bundle."""
        return self.start_agent

    # -- give it back ----------------------------------------------------------------------
    def release(self) -> None:
        with self._lock:
            pg, self.pg, self.job_id = self.pg, None, None
        if pg is None:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(pg)  # its actors go with it
        except Exception:  # noqa: BLE001 - the cluster is gone: so is the group
            pass
        self.last = JobState("REMOVED")
        if self._connected_here and ray.is_initialized():
            ray.shutdown()
            self._connected_here = False

