"""Which of torch's c10d tests the harness runs: the tests of ``DistributedTest._DistTestBase``
(what torch's ``test/distributed/test_distributed_spawn.py`` runs) that gloo can run on a CPU
machine at world size 4. Listed in a child process (importing torch's test module needs
``BACKEND`` in the environment, and the pytest process keeps out of torch's test internals).

Left out: tests torch marks skipped at import for gloo (``__unittest_skip__``: NCCL-only, ...)
and tests decorated to need a GPU (``skip_if_no_gpu``, ``skip_if_lt_x_gpu``): on a CPU machine
every rank of those exits with a skip code before it does anything. Kept, and run: tests that
skip at run time for another reason (a world size, a backend feature), as torch's launcher does.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # torch_rpc, kernel_helpers

from torch_rpc.pool import sample  # noqa: E402

__all__ = ["CLS", "ENV", "HERE", "Test", "pool", "sample"]  # sample: re-exported

HERE = Path(__file__).resolve().parent
# what torch's spawn test reads (test_distributed_spawn.py, run as torch's CI runs it for gloo)
ENV = {"BACKEND": "gloo", "WORLD_SIZE": "4"}
GPU_DECORATORS = ("@skip_if_no_gpu", "@skip_if_lt_x_gpu")
CLS = "TestDistBackendWithSpawn"


@dataclass(frozen=True)
class Test:
    name: str  # the test method of _DistTestBase
    cls: str = CLS  # the class torch's spawn test runs it in

    @property
    def id(self) -> str:
        return f"{self.cls}.{self.name}"

    world_size = int(ENV["WORLD_SIZE"])


def _decorators(fn) -> list[str]:
    lines = inspect.getsource(fn).splitlines()  # the decorators come with the source
    return [line.strip().split("(")[0] for line in lines if line.strip().startswith("@")]


def _list() -> list[str]:  # runs in the child, with ENV set
    import runner

    base = runner.DistributedTest._DistTestBase
    found = []
    for name in sorted(n for n in dir(base) if n.startswith("test")):
        fn = getattr(base, name)
        if getattr(fn, "__unittest_skip__", False):
            continue
        if any(d in GPU_DECORATORS for d in _decorators(fn)):
            continue
        found.append(name)
    return found


def pool(python: str = sys.executable) -> list[Test]:
    """Every CPU test, in a stable order."""
    out = subprocess.run([python, "-c", "import json, pool; print(json.dumps(pool._list()))"],
                         cwd=HERE, capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, **ENV})
    return [Test(n) for n in json.loads(out.stdout.strip().splitlines()[-1])]


if __name__ == "__main__":
    print(json.dumps(_list(), indent=1))
