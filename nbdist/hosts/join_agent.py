"""The join agent: the warm template's twin on another host (``python -m nbdist.join``).

A launcher (ssh, srun, ``ip netns exec``...) starts it on the host. It reads one JSON line
from stdin — the notebook's join address, the session's secret and its host label — so the
secret is never on a command line or in an environment. It connects to the notebook (both
sides prove the secret before a byte is unpickled), pins torch's data plane to the interface
it reached the notebook through, having imported torch once, and forks that host's ranks
on request exactly as the local template does, each with a pipe to the agent through which
the notebook's cells, interrupts and stops reach all of them in one frame (``hosts.rank_pipes``).
It exits, SIGKILLing its ranks, when the notebook's connection closes, when the notebook has
been silent for ``AGENT_SILENCE`` seconds (a link down), or on ``Exit``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

from ..control.channel import connect
from ..control.protocol import AgentReady
from ..proc.template import preload, serve
from ..rank_config import RankConfig
from . import netif
from .host_agents import AGENT_SILENCE, HEARTBEAT
from .rank_pipes import RankPipes

__all__ = ["main"]
_STDIN_WAIT = 60.0


def _read_request() -> dict:
    ready, _, _ = select.select([sys.stdin], [], [], _STDIN_WAIT)
    if not ready:
        raise SystemExit("nbdist.join: nothing on stdin: this agent is started by the notebook "
                         "(`%dist_start --hosts ...`), not by hand")
    line = sys.stdin.readline()
    try:
        request = json.loads(line)
        request["key"] = bytes.fromhex(request["key"])
        request["address"] = (request["address"][0], int(request["address"][1]))
    except (ValueError, KeyError, TypeError, IndexError):
        raise SystemExit("nbdist.join: the first line on stdin is not the notebook's join "
                         "request") from None
    return request


def _adapt(config: RankConfig, iface: str) -> RankConfig:
    """A config made on the notebook, made right for this host: this host's environment and
    Python path (plus the notebook's entries that exist here), its working directory if it
    exists here, torch's sockets on ``iface``, threads shared among this host's ranks."""
    env = dict(os.environ)
    env.update(config.env_extra or {})
    env.update({"TP_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface})
    per_host = max(int(config.host_ranks or 1), 1)
    threads = config.threads or max(1, (os.cpu_count() or 1) // per_host)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    path = list(sys.path) + [p for p in config.path if p and p not in sys.path
                             and os.path.isdir(p)]
    cwd = config.cwd or ""
    return config.adapted(env=env, path=path, threads=threads,
                          affinity=_cpus_of(config.cpu_share),
                          cwd=cwd if os.path.isdir(cwd) else os.path.expanduser("~"))


def _cpus_of(share: tuple[int, int] | None) -> list[int] | None:
    """The CPUs of the k-th of n ranks (``share``: [k, n]): its part of the CPUs this agent
    may use (under SLURM, the CPUs its step holds on the node), as srun binds its tasks;
    None when there are fewer CPUs than ranks (they share them all)."""
    if not share or not hasattr(os, "sched_getaffinity"):
        return None
    local, ranks = share
    cpus = sorted(os.sched_getaffinity(0))
    per = len(cpus) // max(ranks, 1)
    return cpus[local * per:(local + 1) * per] if per >= 1 else None


def _leave(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_IGN)
    raise SystemExit(0)  # unwinds into serve's cleanup: every rank here is killed


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches ranks through the notebook
    signal.signal(signal.SIGTERM, _leave)
    signal.signal(signal.SIGHUP, _leave)  # the launcher's session ended (ssh hung up)
    request = _read_request()
    preload()  # before connecting, so agents on many hosts import torch at the same time
    chan = connect(request["address"], request["key"], timeout=30.0, name="notebook",
                   threaded=False)
    address = chan.sock.getsockname()[0]
    iface = netif.name_of_address(address) or "lo"
    chan.send(AgentReady(request["host"], os.getpid(), socket.gethostname(), iface, address))
    try:
        serve(chan, prepare=lambda cfg: _adapt(cfg, iface), heartbeat=HEARTBEAT,
              silence=AGENT_SILENCE, relay=RankPipes())
    finally:
        os._exit(0)
