"""Run cases from a world in one real kernel, as a user pastes a program into cells.

``WorldSide`` keeps one kernel for every case: a case whose world kind (``cases.FLAGS``)
differs from the running world's, or that asks ``fresh``, gets ``%dist_stop`` and a new
``%dist_start``; one that only needs another size gets ``%dist_restart N --keep``. Before each
case one harness cell sets ``CONF_OUT``, ``CONF_PORT`` and ``CONF_PORT2`` on every rank; then
the program runs unchanged: in a ``%%dist --local`` cell (torchrun style) or a plain cell
(spawn style). A case that fails where it should not is followed by a new kernel, so that
whatever it left behind (in torch's process-wide state too) does not fail the cases after it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from conftest import expand_ranks
from kernel_helpers import Kernel

from .cases import FLAGS, Case
from .observe import Run, add_output, read_records, split_by_rank
from .script import program, quiet_port

__all__ = ["WorldSide"]

WORKER = r"\[worker(\d+)\] "  # a world's prefix on a worker's lines (default names)
CELL_TIMEOUT = 120.0  # seconds: a case's cell past this is a hang, and the kernel is replaced


class WorldSide:
    """One kernel that runs cases one after another (``run``); ``close`` ends it."""

    def __init__(self) -> None:
        self.kernel: Kernel | None = None
        self.kind: str | None = None  # the running world's kind; None: no world
        self.n = 0  # its ranks

    def _cell(self, code: str, timeout: float = 60):
        assert self.kernel is not None
        rep = self.kernel.execute(code, timeout=timeout)
        return rep

    def _must(self, code: str, timeout: float = 60) -> None:
        rep = self._cell(code, timeout)
        if rep.status != "ok":
            raise RuntimeError(f"harness cell failed: {code!r}: {rep.error}\n{rep.stderr}")

    def _prepare(self, case: Case, out: Path, ports: tuple[int, int]) -> None:
        if self.kernel is None:
            self.kernel = Kernel()
            self._must("%load_ext nbdist")
        if case.fresh or case.world != self.kind:
            if self.kind is not None:
                self._must("%dist_stop")
            self.kind = None
            self._must(f"%dist_start {case.n - 1} {FLAGS[case.world]}", timeout=120)
        elif case.n != self.n:
            self._must(f"%dist_restart {case.n - 1} --keep", timeout=120)
        self.kind, self.n = case.world, case.n
        self._must(f"%%dist --local\nimport os\nos.environ['CONF_OUT'] = {str(out)!r}\n"
                   f"os.environ['CONF_PORT'] = '{ports[0]}'\n"
                   f"os.environ['CONF_PORT2'] = '{ports[1]}'")

    def run(self, case: Case, out: Path) -> Run:
        """Run ``case`` in a world of its kind and size; its records go to ``out``."""
        out.mkdir(parents=True)
        self._prepare(case, out, (quiet_port(), quiet_port()))
        code = program(case)
        if case.style == "torchrun":
            code = "%%dist --local\n" + code
        t0 = time.monotonic()
        try:
            rep = self._cell(code, timeout=CELL_TIMEOUT)
        except TimeoutError:
            self.kernel.km.interrupt_kernel()  # Ctrl-C, then the world and kernel end
            self.close()  # the next case gets a new kernel
            raise
        run = Run(ranks=read_records(out), failed=rep.status != "ok",
                  seconds=time.monotonic() - t0, text=rep.stdout + rep.stderr)
        add_output(run, case.style, split_by_rank(rep.stdout, WORKER),
                   split_by_rank(rep.stderr, WORKER))
        if rep.error is not None:
            run.text += f"\n{rep.error['ename']}: {rep.error['evalue']}"
            run.raised = _raised(rep.error)
            if case.raises is None:  # unexpected: what it left must not fail the next case
                self.close()
        return run

    def close(self) -> None:
        """Stop the world and end the kernel; the next case starts a new one either way."""
        kernel, kind = self.kernel, self.kind
        self.kernel, self.kind, self.n = None, None, 0
        if kernel is None:
            return
        try:
            if kind is not None:
                kernel.execute("%dist_stop", timeout=90)
        finally:
            kernel.close()


def _raised(error: dict) -> list[str]:
    """``"r1 NameError"`` for each rank a cell's error names."""
    if error["ename"] != "DistCellError":
        return [f"r0 {error['ename']}"]
    found = set()
    # one per distinct error, led by the ranks that raised it: ``[worker1-3,5] NameError:``
    for ranks, name in re.findall(r"\[worker([\d,\-]+)\] (\w+):", error["evalue"]):
        found.update(f"r{rank} {name}" for rank in expand_ranks(ranks))
    return sorted(found)
