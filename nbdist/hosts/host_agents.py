"""Join agents on other hosts, seen from the notebook: launch, authenticate, watch, stop.

``HostAgent`` is the remote twin of ``launch.Template``, a ``launch.ForkClient`` as it is
(same ``spawn``/``kill``/``close``, same ``on_exit`` reports): its process is the launcher
(``ssh host python -m nbdist.join`` and the like), its channel the TCP connection the agent
opened back to the notebook.
``start_agents`` launches the agents that are not running, with one join listener bound to
``--iface`` that closes once they are all in. Heartbeats run both ways; a host silent for
``SILENCE`` seconds, or whose connection closes, is lost (``on_lost``); an agent whose
notebook is silent for ``AGENT_SILENCE`` seconds ends its ranks and exits. ``relay`` sends
one frame for many ranks of the host; what the agent relays back goes to ``on_relayed``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..control.channel import Channel, ChannelClosed, HandshakeError, Listener
from ..control.protocol import AgentReady, Heartbeat, ProtocolError, Relay, Relayed
from ..errors import DistTimeoutError, StartError
from ..rank_info import describe_exit
from .launch import ForkClient
from .netif import Interface
from .scheduler import STEP_LAUNCHERS

__all__ = ["AGENT_SILENCE", "HEARTBEAT", "LAUNCHERS", "SILENCE", "HostAgent", "launcher_argv",
           "start_agents"]

LAUNCHERS = {
    "ssh": "ssh -o BatchMode=yes {host} {command}",
    **STEP_LAUNCHERS,  # a step of the allocation the notebook runs in (srun)
}
HEARTBEAT = 1.0  # seconds between heartbeats, both ways
SILENCE = 4.0  # an agent silent this long is lost (a host lost is noticed within 5 s)
# ... while a world starts (``HostAgent.starting``): 8 hosts x 16 ranks joining on 2 cores
# left an agent's heartbeat unanswered for over 4 s and lost a host that was fine. An agent
# killed is noticed at once either way (its connection closes).
START_SILENCE = 20.0
# a notebook silent this long is gone, for its agents: longer, so a notebook whose Python
# stalls for a few seconds (a long call holding the GIL) does not lose its remote ranks
AGENT_SILENCE = 12.0
_STDERR_KEEP = 4000  # characters of a launcher's stderr kept for error messages


def launcher_argv(launcher: str, host: str, command: list[str]) -> list[str]:
    """The argv that starts ``command`` on ``host`` with ``launcher`` (a built-in name or a
    template with ``{host}`` and ``{command}``)."""
    template = LAUNCHERS.get(launcher, launcher)
    if "{command}" not in template:
        raise ValueError(f"--launcher {launcher!r} has no {{command}}: use ssh, srun, or a "
                         "template with {host} and {command}, e.g. "
                         "'ip netns exec {host} {command}'")
    try:
        line = template.format(host=shlex.quote(host), command=shlex.join(command))
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"--launcher {launcher!r} is not a valid template ({exc}); its only "
                         "fields are {host} and {command}") from None
    return shlex.split(line)


class HostAgent(ForkClient):
    """Client side of the join agent on one host."""

    def __init__(self, host: str, launcher: str, remote_python: str, iface: Interface,
                 start: Callable[..., Any] | None = None) -> None:
        super().__init__()
        # a scheduler that starts agents itself (Ray's actors): ``start(host, argv, request,
        # on_stderr)`` returns a ``Popen``-like handle (``scheduler_api.Allocation.starter``)
        self.start = start
        self.host, self.launcher, self.remote_python, self.iface = (host, launcher,
                                                                     remote_python, iface)
        self.info: AgentReady | None = None
        self.lost: str | None = None  # why the host was lost, once it was
        self.on_lost: Callable[[str, str], None] | None = None
        # the world's receiver: what the agent relays from its ranks (``Relayed``)
        self.on_relayed: Callable[[str, Relayed], None] | None = None
        self.relayed_frames = 0  # ``Relayed`` frames had from the agent, for tests
        self.starting = False  # a world is starting on it: silence is lost at START_SILENCE
        self.beat = Heartbeat()
        self.argv: list[str] = []
        self._stderr: list[str] = []

    # -- life cycle ---------------------------------------------------------------------------
    def alive(self) -> bool:
        return super().alive() and self.lost is None and self.info is not None

    def launch(self, join_address: tuple[str, int], key: bytes) -> None:
        """Start the launcher; the agent will connect to ``join_address`` proving ``key``."""
        self.close(timeout=1.0)
        self.info, self.lost, self._stderr = None, None, []
        request = {"host": self.host, "address": list(join_address), "key": key.hex()}
        self._start(json.dumps(request) + "\n")

    def _start(self, request: str) -> None:
        """Run the launcher and give the agent ``request`` on its stdin."""
        command = [self.remote_python, "-m", "nbdist.join"]
        if self.start is not None:
            self.argv = command
            self.proc = self.start(self.host, command, request, self._stderr.append)
            return
        self.argv = launcher_argv(self.launcher, self.host, command)
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         start_new_session=True, close_fds=True)
        except OSError as exc:
            raise StartError(f"could not run the launcher for host {self.host!r}: "
                             f"{shlex.join(self.argv)}: {exc}") from None
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(request.encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # it died at once: the start reports its stderr
        threading.Thread(target=self._read_stderr, args=(self.proc,), daemon=True,
                         name="nbdist-launcher-stderr").start()

    def _read_stderr(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            self._stderr.append(raw.decode(errors="replace"))
            while sum(map(len, self._stderr)) > _STDERR_KEEP and len(self._stderr) > 1:
                self._stderr.pop(0)
        proc.stderr.close()

    def stderr(self) -> str:
        return "".join(self._stderr).strip()

    def failure(self) -> str | None:
        """Why the launcher ended before its agent joined, with its command and stderr."""
        if self.proc is None or self.proc.poll() is None:
            return None
        time.sleep(0.05)  # the stderr reader's last lines
        err = self.stderr() or "(nothing on stderr)"
        return (f"the launcher for host {self.host!r} {describe_exit(self.proc.returncode)} "
                f"before its agent joined.\ncommand: {shlex.join(self.argv)}\nstderr:\n{err}")

    def attach(self, chan: Channel, ready: AgentReady) -> None:
        """The agent joined: read its messages from now on."""
        self.conn, self.info = chan, ready
        chan.name = f"the agent on {self.host}"
        self._ready.set()
        self._reader = threading.Thread(target=self._read_loop, args=(chan, self.proc),
                                        name=f"nbdist-agent-{self.host}", daemon=True)
        self._reader.start()

    def _read_loop(self, conn: Channel, proc: subprocess.Popen) -> None:
        heard = time.monotonic()
        while True:
            try:
                msg = conn.recv(timeout=SILENCE)
            except ProtocolError:
                continue
            except DistTimeoutError:
                silent = time.monotonic() - heard
                if self.starting and silent < START_SILENCE:
                    continue
                self._lose(f"no heartbeat for {silent:.0f}s")
                return
            except (EOFError, OSError):
                self._lose("its agent's connection closed")
                return
            heard = time.monotonic()
            if isinstance(msg, Heartbeat):
                self.beat = msg
                try:
                    conn.send(Heartbeat())
                except OSError:
                    pass
            elif isinstance(msg, Relayed):
                self.relayed_frames += 1
                if self.on_relayed is not None:
                    self.on_relayed(self.host, msg)
            else:
                self._dispatch(msg)

    def _lose(self, why: str) -> None:
        if self.conn is None or self.lost is not None:
            return  # closed on purpose
        self.lost = why
        self._ready.clear()
        with self._spawn_cv:
            self._spawn_cv.notify_all()
        if self.on_lost is not None:
            self.on_lost(self.host, why)

    @property
    def pid(self) -> int | None:
        return self.info.pid if self.info is not None else None

    def relay(self, ranks: list[int], payload: bytes) -> int:
        """Hand ``payload`` (one encoded frame for a rank) to these ranks of the host, in
        one frame to the agent; returns its size in bytes. ``ChannelClosed``: the host is
        lost or its agent closed."""
        conn = self.conn
        if conn is None or not self.alive():
            raise ChannelClosed(f"the agent on {self.host} is not connected")
        return conn.send(Relay(tuple(ranks), payload))

    def close(self, timeout: float = 5.0) -> None:
        """Ask the agent to exit (it kills its ranks); end the launcher."""
        conn, proc = self.conn, self.proc
        self.lost = self.lost or "closed"
        super().close(timeout)  # sends Exit, waits for the launcher, joins the reader
        if conn is not None:
            conn.close(timeout=0)
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        release = getattr(proc, "release", None)  # a scheduler's handle: its actor goes too
        if release is not None:
            release()


def start_agents(agents: list[HostAgent], key: bytes, deadline: float) -> None:
    """Launch every agent in ``agents`` that is not running and wait until each has joined.

    One listener on the agents' ``iface`` takes their connections and closes when they are
    all in. A launcher that ends first fails the start with its command and stderr; a peer
    that fails the handshake is dropped and logged.
    """
    todo = [a for a in agents if not a.alive()]
    if not todo:
        return
    listener = Listener((todo[0].iface.address, 0), key)
    try:
        for agent in todo:
            agent.launch(listener.path, key)  # type: ignore[arg-type]
        waiting = {a.host: a for a in todo}
        while waiting:
            for agent in waiting.values():
                why = agent.failure()
                if why is not None:
                    raise StartError(why)
            if time.monotonic() > deadline:
                hosts = ", ".join(sorted(waiting))
                raise DistTimeoutError(f"timed out waiting for the join agent on {hosts} to "
                                       "connect and import torch; its launcher's stderr: "
                                       + " | ".join(f"{h}: {a.stderr() or '(empty)'}"
                                                    for h, a in waiting.items()))
            try:
                chan = listener.accept(0.1, name="a join agent")
            except DistTimeoutError:
                continue
            except HandshakeError as exc:
                print(f"nbdist: dropped a connection to the join listener: {exc}",
                      file=sys.stderr)
                continue
            try:
                ready = chan.recv(timeout=max(deadline - time.monotonic(), 0.1))
            except (DistTimeoutError, ProtocolError, EOFError, OSError):
                chan.close(timeout=0)
                continue
            agent = waiting.get(ready.host) if isinstance(ready, AgentReady) else None
            if agent is None:
                chan.close(timeout=0)
                continue
            agent.attach(chan, ready)
            del waiting[ready.host]
    except BaseException:
        for agent in todo:
            if not agent.alive():
                agent.close(timeout=1.0)  # a launcher still trying is stopped with the start
        raise
    finally:
        listener.close()
