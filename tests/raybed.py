"""A real Ray cluster on this one machine, for tests: the head on the host side (where the
notebook and its driver run, as on a Ray head node) and worker nodes ``nbrayK`` that are network
namespaces (and UTS namespaces: hostname ``nbrayK``) on a private bridge, like the SLURM test
bed (``../shared/slurm``). Ray 2.60 core only (no dashboard, no ``ray list``).

    with RayBed(nodes=2, cpus=2) as bed:      # or bed.up() ... bed.down()
        ray.init(address=bed.address)         # the driver: this process, on the host side

| address | what |
|---|---|
| 10.77.14.1 on bridge ``nbraybr0`` | head: gcs_server (port 26379), a raylet with 0 CPUs |
| 10.77.14.(1+K), ``eth0`` in netns ``nbrayK`` | node K: raylet, ``cpus`` CPUs, ``{"nbrayK": 1}`` |

Every node runs under a small keeper process (a child subreaper), so that everything its
``ray start`` leaves behind (daemons, agents, Ray workers, orphans of a killed raylet) stays in
one process tree; keepers and daemons carry ``NBRAY_BED`` in their environment. ``down()``
ends all of it by pid (never ``ray stop``, which ends every Ray on the machine), then deletes
the namespaces, the bridge and ``/tmp/nbray``. Needs root, ``ip``, ``nsenter`` and ``unshare``
and ray in this interpreter's environment. A killed raylet is a dead node within ~0.6 s
(``HEALTH``); no idle Python workers are prestarted (``LEAN``); object stores are 100 MB.
Measured on 2 busy cores: up() 10-20 s (CPU-bound: a dozen Python processes import ray),
down() 0.2 s, ~1.3 GB RSS summed (~0.8 GB PSS) for 2 nodes, 0.3 GB less without log monitors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

__all__ = ["BRIDGE", "HEALTH", "LEAN", "PORT", "ROOT", "RayBed", "cannot_run", "leftovers"]

BRIDGE = "nbraybr0"
PORT = 26379  # the GCS; outside Ray's defaults (6379, workers 10002-19999) so both can run
ROOT = Path("/tmp/nbray")  # temp dirs of the nodes (short: Ray's Unix socket paths live there)
MARK = "NBRAY_BED"  # in the environment of every keeper and the daemons they start (one bed
# per machine: the bridge, ports and /tmp/nbray are fixed)
RAY = Path(sys.prefix) / "bin" / "ray"
PYTHON = sys.executable
# Ray's settings (RayConfig: every Ray process reads RAY_<name>). The health checks are the
# GCS's gRPC pings of each raylet; Ray's defaults (5 s delay, every 3 s, 10 s timeout, 5 misses)
# take ~13 s to call a killed raylet's node dead. Here: ~0.6 s when its port refuses (3 x
# 200 ms), ~2 s when it is silent (a veth down: 3 x (500 + 200) ms).
HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "200",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
# no idle Python workers started ahead of work (with enable_worker_prestart=1: one per CPU at
# raylet start; both are Ray's defaults in 2.60, pinned here so that memory stays small)
LEAN = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
OBJECT_STORE = 100_000_000  # bytes per node (Ray's minimum is 75 MB)

# The keeper: a child subreaper that runs `ray start`, writes its exit status to a file and
# then reaps whatever the daemons leave, so that they all stay in its tree until down().
_KEEPER = r"""
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
log, rc_file, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(log, "ab") as out:
    rc = subprocess.call(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
with open(rc_file + ".tmp", "w") as f:
    f.write(str(rc))
os.replace(rc_file + ".tmp", rc_file)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""

# from a driver-side subprocess: the GCS's tables, without ray.init (no job, no raylet needed).
# "nodes": the node table; "leftovers": live actors and placement groups; "wait IPS S": the
# node table once the nodes of those IPs are all alive (exit status 1 after S seconds)
_STATE = r"""
import json, sys, time
from ray._private.internal_api import get_state_from_address
state = get_state_from_address(sys.argv[1])
what = sys.argv[2]
def nodes():
    return [{"id": n["NodeID"], "alive": n["Alive"], "ip": n["NodeManagerAddress"],
             "host": n["NodeManagerHostname"], "resources": n.get("Resources", {})}
            for n in state.node_table()]
rc = 0
if what == "nodes":
    out = nodes()
elif what == "wait":
    want, deadline = set(json.loads(sys.argv[3])), time.monotonic() + float(sys.argv[4])
    while True:
        out = nodes()
        if want <= {n["ip"] for n in out if n["alive"]}:
            break
        if time.monotonic() > deadline:
            rc = 1
            break
        time.sleep(0.1)
else:
    actors = [{"id": a["ActorID"], "class": a["ActorClassName"], "name": a["Name"],
               "state": a["State"], "job": a["JobID"], "node": a["Address"]["NodeID"],
               "pid": a["Pid"], "detached": a["IsDetached"]}
              for a in state.actor_table(None).values() if a["State"] != "DEAD"]
    pgs = [{"id": p["placement_group_id"], "name": p["name"], "state": p["state"],
            "strategy": p["strategy"]}
           for p in state.placement_group_table().values() if p["state"] != "REMOVED"]
    out = [actors, pgs]
print(json.dumps(out))
sys.exit(rc)
"""


def cannot_run() -> str | None:
    """None when the Ray test bed can start here, else why not."""
    if sys.platform != "linux":
        return "the Ray test bed needs Linux (network namespaces)"
    if os.geteuid() != 0:
        return "the Ray test bed needs root (namespaces, bridge)"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"the Ray test bed needs {tool} (iproute2, util-linux)"
    if importlib.util.find_spec("ray") is None or not RAY.is_file():
        return f"ray is not installed in {sys.prefix} (pip install ray)"
    return None


def _gcs_state(address: str, what: str, timeout: float = 60) -> object:
    """Ask the GCS at ``address`` from a fresh subprocess (``nodes`` or ``leftovers``)."""
    done = subprocess.run([PYTHON, "-c", _STATE, address, what], capture_output=True,
                          text=True, timeout=timeout, env=_clean_env())
    if done.returncode:
        raise RuntimeError(f"asking the GCS at {address} for {what} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def leftovers(address: str) -> tuple[list[dict], list[dict]]:
    """The actors that are not DEAD and the placement groups that are not REMOVED, as the GCS
    at ``address`` lists them (no dashboard needed). Actors: dicts of id, class, name, state,
    job, node, pid, detached; placement groups: id, name, state, strategy."""
    actors, pgs = _gcs_state(address, "leftovers")  # type: ignore[misc]
    return actors, pgs


def _clean_env() -> dict[str, str]:
    """This process's environment without a RAY_ADDRESS or bed marker of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", MARK)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (iproute2)."""
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


def _ino(path: str) -> tuple[int, int] | None:
    """Device and inode of ``path`` (a namespace's identity), None if it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class _Proc:
    """What /proc says of one process: parent, state, name, bed marker, network namespace."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        rest = stat[stat.rindex(b")") + 2:].split()
        self.comm = stat[stat.index(b"(") + 1:stat.rindex(b")")].decode(errors="replace")
        self.state, self.ppid = rest[0].decode(), int(rest[1])
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            env = []
        self.mark = next((e.split(b"=", 1)[1].decode(errors="replace") for e in env
                          if e.startswith(MARK.encode() + b"=")), None)
        self.node = next((e.split(b"=", 1)[1].decode(errors="replace") for e in env
                          if e.startswith(b"NBRAY_NODE=")), None)
        self.netns = _ino(f"/proc/{pid}/ns/net")


def _procs() -> dict[int, _Proc]:
    """Every process of the machine, by pid."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = _Proc(int(name))
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile
    return out


class RayBed:
    """``up()`` a cluster of a head (host side, 0 CPUs) and ``nodes`` worker nodes with
    ``cpus`` CPUs each, ``down()`` after; a context manager too. ``net`` is a /24 of our own."""

    def __init__(self, nodes: int = 2, cpus: int = 2, net: str = "10.77.14", *,
                 log_monitor: bool = True, monitor: bool = False,
                 settings: dict[str, str] | None = None) -> None:
        if not 1 <= nodes <= 8:
            raise ValueError("nodes: 1..8")
        self.nodes, self.cpus, self.net = nodes, cpus, net
        # a log monitor per node sends its workers' output to the drivers (~100 MB each)
        self.log_monitor = log_monitor
        # the head's autoscaler monitor (~100 MB): only `ray status` needs it
        self.monitor = monitor
        # RAY_<name> settings of every Ray process of the bed, over HEALTH and LEAN
        self.settings = {**HEALTH, **LEAN, **(settings or {})}
        self.head_ip = f"{net}.1"
        self.address = f"{self.head_ip}:{PORT}"
        self.node_ips = [f"{net}.{1 + k}" for k in range(1, nodes + 1)]
        self.names = [f"nbray{k}" for k in range(1, nodes + 1)]
        # what a driver on the host side adds to its environment ({**os.environ, **env})
        self.env = {"RAY_ADDRESS": self.address, "RAY_USAGE_STATS_ENABLED": "0"}
        self.up_s: float | None = None  # how long the last up() and down() took
        self.down_s: float | None = None
        self._keepers: list[subprocess.Popen[bytes]] = []

    # --- context manager ------------------------------------------------------------------
    def __enter__(self) -> RayBed:
        self.up()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    # --- up -------------------------------------------------------------------------------
    def up(self, timeout: float = 120) -> None:
        """Start the cluster (after a ``down()``) and wait until the GCS lists every node
        alive; on any failure everything is torn down and RuntimeError says what was missing."""
        why = cannot_run()
        if why:
            raise RuntimeError(why)
        self.down()
        t0 = time.monotonic()
        deadline = t0 + timeout
        waiter: subprocess.Popen[str] | None = None
        try:
            self._network()
            ROOT.mkdir(parents=True, exist_ok=True)
            common = ["--disable-usage-stats", f"--object-store-memory={OBJECT_STORE}",
                      f"--include-log-monitor={str(self.log_monitor).lower()}"]
            head = [str(RAY), "start", "--head", f"--node-ip-address={self.head_ip}",
                    f"--port={PORT}", "--num-cpus=0", "--include-dashboard=false",
                    # fixed host-side ports outside a default Ray's (8265, 52365, 10002-19999)
                    "--dashboard-port=26381", "--dashboard-agent-listen-port=26380",
                    "--min-worker-port=26400", "--max-worker-port=26999",
                    *([] if self.monitor else ["--no-monitor"]),
                    f"--temp-dir={ROOT / 'head'}", *common]
            self._start("head", [], head)
            self._wait_started(["head"], deadline)
            # a driver-side process that waits for every node at the GCS; it imports ray
            # (seconds on a busy machine) while the nodes start
            want = json.dumps([self.head_ip, *self.node_ips])
            waiter = subprocess.Popen(
                [PYTHON, "-c", _STATE, self.address, "wait", want,
                 str(max(deadline - time.monotonic(), 1))],
                env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for k, name in enumerate(self.names, 1):
                cmd = [str(RAY), "start", f"--address={self.address}",
                       f"--node-ip-address={self.node_ips[k - 1]}", f"--num-cpus={self.cpus}",
                       f"--resources={json.dumps({name: 1})}", f"--temp-dir={ROOT / name}",
                       *common]
                # own network and UTS namespace (hostname nbrayK); nsenter and unshare exec
                ns = ["nsenter", f"--net=/run/netns/{name}", "--", "unshare", "--uts", "--",
                      "sh", "-c", f'hostname {name} && exec "$@"', "sh"]
                self._start(name, ns, cmd)
            self._wait_started(self.names, deadline)
            try:
                out, err = waiter.communicate(timeout=max(deadline - time.monotonic(), 1) + 5)
            except subprocess.TimeoutExpired:
                waiter.kill()
                out, err = waiter.communicate()
            if waiter.returncode:
                raise RuntimeError(f"waited for nodes {want} to be alive at the GCS "
                                   f"{self.address}; it lists: {out.strip()}\n{err[-3000:]}")
        except BaseException:
            if waiter is not None and waiter.poll() is None:
                waiter.kill()
                waiter.wait()
            self.down()
            raise
        self.up_s = time.monotonic() - t0

    def _network(self) -> None:
        """The bridge on the host side, and per node a namespace with a veth into it."""
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{self.head_ip}/24", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for k, name in enumerate(self.names, 1):
            _ip("netns", "add", name)
            self._gone(f"nbrayv{k}")  # a deleted namespace's veth goes a moment later
            _ip("link", "add", f"nbrayv{k}", "type", "veth", "peer", "name", "eth0", "netns",
                name)
            _ip("link", "set", f"nbrayv{k}", "master", BRIDGE, "up")
            _ip("-n", name, "addr", "add", f"{self.node_ips[k - 1]}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")

    @staticmethod
    def _gone(link: str, timeout: float = 10.0) -> None:
        """Wait until the host side has no ``link`` (deleting it if it stays)."""
        deadline = time.monotonic() + timeout
        while _ip("link", "show", link, check=False).returncode == 0:
            if time.monotonic() > deadline:
                _ip("link", "del", link, check=False)
                return
            time.sleep(0.05)

    def _start(self, node: str, prefix: list[str], cmd: list[str]) -> None:
        """Start ``ray start`` of ``node`` under a keeper, behind ``prefix`` (nsenter...)."""
        env = {**_clean_env(), **self.settings, MARK: self.net, "NBRAY_NODE": node}
        keeper = [*prefix, PYTHON, "-c", _KEEPER, str(ROOT / f"{node}.log"),
                  str(ROOT / f"{node}.rc"), *cmd]
        with open(ROOT / f"{node}.keeper.log", "ab") as err:
            self._keepers.append(subprocess.Popen(
                keeper, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err, start_new_session=True))

    def _wait_started(self, nodes: list[str], deadline: float) -> None:
        """Until ``ray start`` of each node has returned 0."""
        left = list(nodes)
        while left:
            for node in list(left):
                rc = ROOT / f"{node}.rc"
                if rc.exists():
                    if rc.read_text().strip() != "0":
                        raise RuntimeError(f"ray start of {node} failed:\n{self._log(node)}")
                    left.remove(node)
            if any(p.poll() is not None for p in self._keepers):
                raise RuntimeError(f"a keeper of {left} exited:\n"
                                   + "\n".join(self._log(n) for n in left))
            if left and time.monotonic() > deadline:
                raise RuntimeError(f"ray start of {left} did not return in time:\n"
                                   + "\n".join(self._log(n) for n in left))
            time.sleep(0.05)

    def _log(self, node: str) -> str:
        """The last lines of a node's ``ray start`` output, for error messages."""
        text = ""
        for f in (ROOT / f"{node}.log", ROOT / f"{node}.keeper.log"):
            if f.exists():
                text += f"--- {f}\n" + "\n".join(f.read_text(errors="replace")
                                                   .splitlines()[-30:]) + "\n"
        return text

    # --- questions ------------------------------------------------------------------------
    def node_ids(self) -> dict[str, str]:
        """Namespace name (``nbrayK``, and ``head``) -> Ray node id (hex), of the alive nodes."""
        by_ip = dict(zip(self.node_ips, self.names, strict=True))
        by_ip[self.head_ip] = "head"
        nodes: list[dict] = _gcs_state(self.address, "nodes")  # type: ignore[assignment]
        return {by_ip[n["ip"]]: n["id"] for n in nodes if n["alive"] and n["ip"] in by_ip}

    def pids(self) -> list[int]:
        """Every live process of the bed: keepers, daemons, agents, Ray workers, and whatever
        runs in the nodes' namespaces, with their descendants."""
        return sorted(self._scan())

    def _scan(self) -> dict[int, _Proc]:
        """The bed's live processes: marked or in its namespaces, and all their descendants."""
        procs = _procs()
        nss = {i for i in (_ino(f"/run/netns/{n}") for n in self._namespaces()) if i}
        me = os.getpid()
        roots = [p for p in procs.values() if p.pid != me
                 and (p.mark is not None or p.netns in nss)]
        children: dict[int, list[int]] = {}
        for p in procs.values():
            children.setdefault(p.ppid, []).append(p.pid)
        out: dict[int, _Proc] = {}
        todo = [p.pid for p in roots]
        while todo:
            pid = todo.pop()
            if pid not in out and pid != me:
                out[pid] = procs[pid]
                todo.extend(children.get(pid, []))
        return {pid: p for pid, p in out.items() if p.state not in ("Z", "X")}

    def raylet_pid(self, k: int) -> int:
        """The raylet of node ``k`` (1..nodes; 0: the head's)."""
        node = "head" if k == 0 else self.names[k - 1]
        found = [p.pid for p in self._scan().values()
                 if p.comm == "raylet" and p.node == node]
        if len(found) != 1:
            raise RuntimeError(f"{len(found)} raylets of {node} running: {found}")
        return found[0]

    def kill_raylet(self, k: int) -> int:
        """SIGKILL the raylet of node ``k``; returns its pid. Its agents and workers exit on
        their own (its log monitor stays); the GCS calls the node dead within ~0.6 s."""
        pid = self.raylet_pid(k)
        os.kill(pid, signal.SIGKILL)
        return pid

    def rss(self) -> int:
        """Resident memory of all the bed's processes together, in bytes (shared pages count
        once per process, as ``ps`` shows them)."""
        total = 0
        for pid in self._scan():
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next((int(line.split()[1]) * 1024 for line in f
                                   if line.startswith("VmRSS:")), 0)
            except OSError:
                pass
        return total

    # --- down -----------------------------------------------------------------------------
    def _namespaces(self) -> list[str]:
        """The bed's network namespaces that exist now (nbrayK), from whichever process."""
        if shutil.which("ip") is None:
            return []
        out = _ip("netns", "list", check=False).stdout.split("\n")
        return [line.split()[0] for line in out if line.startswith("nbray")
                and line.split()[0][5:].isdigit()]

    def down(self, timeout: float = 60) -> None:
        """Stop every process of the bed by pid (SIGKILL; never ``ray stop``), then delete
        the namespaces, the bridge and /tmp/nbray. Safe to call twice or after a failed up()."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            procs = self._scan()
            if not procs:
                break
            # the keepers last: while they live, orphans stay in their trees
            tops = {pid for pid, p in procs.items() if p.ppid not in procs}
            victims = [pid for pid in procs if pid not in tops] or list(procs)
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in self._keepers:  # reap ours
                if p.pid in victims:
                    try:
                        p.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of the Ray bed survive SIGKILL: {sorted(procs)}")
            time.sleep(0.02)
        self._keepers = [p for p in self._keepers if p.poll() is None]
        for name in self._namespaces():
            _ip("netns", "del", name, check=False)
        if shutil.which("ip") and _ip("link", "show", BRIDGE, check=False).returncode == 0:
            _ip("link", "del", BRIDGE, check=False)
        shutil.rmtree(ROOT, ignore_errors=True)
        self.down_s = time.monotonic() - t0
