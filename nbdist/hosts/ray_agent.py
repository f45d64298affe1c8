"""The Ray actor that holds a join agent on its bundle's node (``--ray``).

``AgentActor`` runs ``python -m nbdist.join`` as its child, writes the notebook's join
request to the child's stdin (the secret never reaches a command line, an environment or
Ray's object store), and dies with it both ways: the child has ``PR_SET_PDEATHSIG`` set to
SIGKILL against the thread that started it, which lives as long as the child, so an actor Ray
kills (its placement group removed, its node dead, the notebook's Ray job ended) takes its
agent and the agent's ranks with it. This module is imported on the nodes; it imports ray
only through the caller.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
from collections import deque

__all__ = ["AgentActor"]

_PR_SET_PDEATHSIG = 1
_STDERR_KEEP = 200  # lines of the agent's stderr kept for the notebook's messages


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class AgentActor:
    """One join agent on this node (made a Ray actor by ``ray_placement``)."""

    def __init__(self, argv: list[str], request: str) -> None:
        self._started = threading.Event()
        self._ended = threading.Event()
        self._stderr: deque[str] = deque(maxlen=_STDERR_KEEP)
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(argv, request), daemon=True,
                                        name="nbdist-ray-agent")
        self._thread.start()
        self._started.wait(30.0)

    def _run(self, argv: list[str], request: str) -> None:
        """Start the agent and wait for it, on one thread: the child's death signal is tied
        to the thread that forked it."""
        try:
            # Ray sets OMP_NUM_THREADS for its workers (1 here: the actor holds no CPU); the
            # agent sets each rank's from the bundle's CPUs
            env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, preexec_fn=_die_with_parent,
                                         close_fds=True, env=env)
        except OSError as exc:
            self.error = f"could not start {argv[0]}: {exc}"
            self._started.set()
            self._ended.set()
            return
        self._started.set()
        assert self.proc.stdin is not None and self.proc.stderr is not None
        try:
            self.proc.stdin.write(request.encode())
            self.proc.stdin.flush()
        except OSError:
            pass  # it died at once: its stderr says why
        for raw in iter(self.proc.stderr.readline, b""):
            self._stderr.append(raw.decode(errors="replace"))
        self.proc.wait()
        self._ended.set()

    def where(self) -> dict:
        """Where this actor runs: the Ray node, its address and name, the agent's pid, the
        GPUs Ray gave it (as ``CUDA_VISIBLE_DEVICES`` numbers them)."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "agent_pid": self.proc.pid if self.proc else None,
                "gpus": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def wait(self) -> tuple[int | None, str]:
        """Block until the agent exits: its exit code (negative: the signal) and stderr."""
        self._ended.wait()
        code = self.proc.returncode if self.proc is not None else 127
        return code, self.error or "".join(self._stderr)

    def stderr(self) -> str:
        return self.error or "".join(self._stderr)

    def signal(self, sig: int) -> None:
        """Signal the agent (SIGTERM: it ends its ranks and exits)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass
