"""Which of torch's RPC tests the harness runs: every CPU test of the suites torch runs on its
TensorPipe agent, with its world size and how it starts RPC. Listed in a child process (the
listing imports torch's test internals, which the pytest process keeps out of)."""

from __future__ import annotations

import inspect
import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HERE", "Test", "pool", "sample"]

HERE = Path(__file__).resolve().parent
# what in a test's source marks it as needing a GPU (torch skips those on a CPU machine)
GPU_MARKS = ("skip_if_lt_x_gpu", "cuda", "device_map", "Cuda")
# what marks a test whose meaning is a process ending (a rank returns so that its process
# exits and the others see it fail, or it shuts RPC down itself): it has no body form
EXIT_MARKS = ("wait_until_node_failure", "rpc.shutdown", "_exit(", "kill", "wait_until_pending")


@dataclass(frozen=True)
class Test:
    cls: str  # the generated class, e.g. TensorPipeRpcTest
    name: str  # the test method
    world_size: int
    setup_rpc: bool  # dist_init starts RPC for it (False: the test calls init_rpc itself)
    body: bool = False  # it has a body form: dist_init starts RPC, and no rank's exit matters

    @property
    def id(self) -> str:
        return f"{self.cls}.{self.name}"


def _source(cls: type, fn, depth: int = 2) -> str:
    """``fn``'s source and that of the ``self._helpers`` it calls, ``depth`` calls down."""
    src = inspect.getsource(fn)
    if depth:
        for helper in sorted(set(re.findall(r"self\.(_\w+)\(", src))):
            target = getattr(cls, helper, None)
            if inspect.isfunction(target):
                src += _source(cls, target, depth - 1)
    return src


def _list() -> list[dict]:  # runs in the child
    import runner

    found = []
    for cls_name, cls in sorted(runner.CLASSES.items()):
        for name in sorted(n for n in dir(cls) if n.startswith("test")):
            fn = getattr(cls, name)
            if getattr(fn, "__unittest_skip__", False):
                continue
            src = inspect.getsource(fn)
            if any(mark in src for mark in GPU_MARKS):
                continue
            wrapper = runner.dist_init_of(fn)
            setup = clean = False
            if wrapper is not None:
                cells = dict(zip(wrapper.__code__.co_freevars,
                                 wrapper.__closure__ or (), strict=True))
                setup = bool(cells["setup_rpc"].cell_contents)
                clean = bool(cells["clean_shutdown"].cell_contents)
                src = _source(cls, cells["old_test_method"].cell_contents)
            found.append({"cls": cls_name, "name": name, "setup_rpc": setup,
                          "body": setup and clean and not any(m in src for m in EXIT_MARKS),
                          "world_size": cls(name).world_size})
    return found


def pool(python: str = sys.executable) -> list[Test]:
    """Every CPU test, in a stable order."""
    out = subprocess.run([python, "-c", "import json, pool; print(json.dumps(pool._list()))"],
                         cwd=HERE, capture_output=True, text=True, timeout=300, check=True)
    return [Test(**d) for d in json.loads(out.stdout.strip().splitlines()[-1])]


def sample(tests: list[Test], n: int, seed: int) -> list[Test]:
    """``n`` tests drawn with ``seed``, in pool order."""
    chosen = set(random.Random(seed).sample(range(len(tests)), min(n, len(tests))))
    return [t for i, t in enumerate(tests) if i in chosen]


if __name__ == "__main__":
    print(json.dumps(_list(), indent=1))
