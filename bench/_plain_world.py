"""The plain torch world the RPC benches compare nbdist with: ``Plain`` starts two processes
of ``_rpc_plain.py`` (they never import nbdist) and drives rank 0 over its stdin.
``rpc/rpc.py`` and ``shm/shm_medium.py`` share it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["Plain"]

HERE = Path(__file__).resolve().parent  # bench/, where _rpc_plain.py and its helpers are


class Plain:
    """Rank 0 of a plain torch world in a child process, driven over its stdin."""

    def __init__(self, tmp: str) -> None:
        init = f"file://{tmp}/plain-rpc"
        env = dict(os.environ, PYTHONPATH=str(HERE))
        script = str(HERE / "_rpc_plain.py")
        self.server = subprocess.Popen([sys.executable, script, "1", init, "1"], env=env,
                                       stdin=subprocess.DEVNULL)
        self.driver = subprocess.Popen([sys.executable, script, "0", init, "1"], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.driver.stdout is not None
        line = self.driver.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"plain torch world did not start: {line!r}")

    def measure(self, kind: str, nbytes: int, n: int, window: int) -> list[float]:
        assert self.driver.stdin is not None and self.driver.stdout is not None
        self.driver.stdin.write(f"{kind} {nbytes} {n} {window}\n")
        self.driver.stdin.flush()
        return json.loads(self.driver.stdout.readline())

    def measure_large(self, kind: str, nbytes: int, n: int) -> list[float]:
        assert self.driver.stdin is not None and self.driver.stdout is not None
        self.driver.stdin.write(f"large {kind} {nbytes} {n}\n")
        self.driver.stdin.flush()
        return json.loads(self.driver.stdout.readline())

    def measure_many(self, scale: float, n: int) -> list[float]:
        """Seconds per echo of ResNet-50's 161 tensors (``_shapes.resnet50_tensors``)."""
        assert self.driver.stdin is not None and self.driver.stdout is not None
        self.driver.stdin.write(f"many {scale} {n}\n")
        self.driver.stdin.flush()
        return json.loads(self.driver.stdout.readline())

    def stop(self) -> None:
        try:
            if self.driver.poll() is None and self.driver.stdin is not None:
                self.driver.stdin.write("quit\n")
                self.driver.stdin.flush()
            for p in (self.driver, self.server):
                p.wait(30)
        except (subprocess.TimeoutExpired, OSError):
            pass
        finally:
            for p in (self.driver, self.server):
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
