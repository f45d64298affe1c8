"""Run torch's RPC tests from one real kernel, cell by cell, as a user pastes them.

``body`` form: an RPC world whose ranks are named as the tests name them (``worker0`` is the
notebook); each test's body runs in one ``%%dist --local`` cell on every rank. ``script``
form: a ``--no-rpc`` world; each test runs as written, its own ``init_rpc`` and ``shutdown``
included, and a rank's failure ends its cell (as it ends a launched process) so that nbdist's
fail-fast stops the others, as torch's launcher terminates them. Worlds are restarted
(``--keep``) when the world size changes; a test still running after ``CELL_TIMEOUT`` is
interrupted and recorded as ``hang``, and the kernel is replaced.
"""

from __future__ import annotations

import time
from pathlib import Path

from kernel_helpers import Kernel

from .outcome import collect, hang, merge
from .pool import HERE, Test

__all__ = ["CELL_TIMEOUT", "WorldSide"]

CELL_TIMEOUT = 90.0

_SETUP = """%%dist --local
import os, sys
sys.path.insert(0, {here!r})
from runner import run_one as _torch_rpc_run
"""
_CELL = """%%dist --local
_torch_rpc_run({cls!r}, {name!r}, int(os.environ["RANK"]), {file!r}, {form!r}, {out!r},
               {raise_!r})
"""


class WorldSide:
    """One kernel that runs tests one after another in a world of the ``form``'s kind. A suite
    whose tests run otherwise (tests/torch_c10d) overrides the cells (``_setup``, ``_cell``),
    what a test leaves (``_done``) and how its ranks' outcomes make one (``merge``)."""

    merge = staticmethod(merge)

    def __init__(self, form: str) -> None:
        assert form in ("body", "script")
        self.form = form
        self.kernel: Kernel | None = None
        self.n = 0  # ranks of the running world (0: none)
        self.seconds = 0.0  # spent in test cells
        self.incidents: list[str] = []  # harness cells that failed (a restart that hung)

    def _must(self, code: str, timeout: float = 120) -> None:
        """Run a harness cell; one that fails or runs past ``timeout`` raises, with what it
        printed so far."""
        assert self.kernel is not None
        said: list[str] = []

        def seen(msg: dict) -> None:
            content = msg["content"]
            said.append(content.get("text") or content.get("evalue") or "")

        try:
            status, _ = self.kernel.cell(code, on_message=seen, timeout=timeout)
        except TimeoutError:
            status = f"still running after {timeout:g}s"
            proc = self.kernel.km.provisioner.process if self.kernel.km.provisioner else None
            ended = proc.poll() if proc is not None else None
            if ended is not None:
                status = f"the kernel died (exit code {ended}; negative: the signal)"
        if status != "ok":
            raise RuntimeError(f"harness cell {code.splitlines()[0]!r}: {status}; it printed:\n"
                               + "".join(said)[-3000:])

    def _world(self, n: int) -> None:
        if self.kernel is None:
            self.kernel = Kernel()
            self._must("%load_ext nbdist")
        if self.n == n:
            return
        if self.n:
            try:
                self._must(f"%dist_restart {n - 1} --keep", timeout=180)
            except RuntimeError as exc:  # said in the report; the next world is a new kernel's
                self.incidents.append(str(exc))
                self.close()
                self._world(n)
                return
        else:
            flags = "--no-rpc" if self.form == "script" else ""
            self._must(f"%dist_start {n - 1} {flags} --name worker0 --worker-name worker{{rank}}",
                       timeout=180)
        self.n = n
        self._must(self._setup())

    def _setup(self) -> str:
        """The cell that readies every rank of a new world."""
        return _SETUP.format(here=str(HERE))

    def _cell(self, k: int, t: Test, where: Path, out: Path) -> str:
        """The cell that runs the ``k``-th test ``t`` on every rank."""
        return _CELL.format(cls=t.cls, name=t.name, file=str(where / f"file{k}"),
                            form=self.form, out=str(out), raise_=self.form == "script")

    def _done(self, k: int, where: Path) -> None:
        """After the ``k``-th test's cell, however it ended (here: nothing to remove)."""

    def run(self, tests: list[Test], where: Path) -> dict:
        """``{test id: outcome}``; each rank's record goes to ``where/out``."""
        out = where / "out"
        out.mkdir(parents=True, exist_ok=True)
        results = {}
        for k, t in enumerate(tests):
            self._world(t.world_size)
            code = self._cell(k, t, where, out)
            t0 = time.monotonic()
            try:
                self.kernel.execute(code, timeout=CELL_TIMEOUT)  # type: ignore[union-attr]
            except TimeoutError:
                results[t.id] = hang(out, t, t.world_size, CELL_TIMEOUT, self.merge)
                self.close()
                continue
            finally:
                self.seconds += time.monotonic() - t0
                self._done(k, where)
            found = collect(out, t, t.world_size, self.merge)
            results[t.id] = (found if found is not None
                             else hang(out, t, t.world_size, 0, self.merge))
        return results

    def close(self) -> None:
        """Stop the world and end the kernel (the next test starts a new one)."""
        kernel, self.kernel, n, self.n = self.kernel, None, self.n, 0
        if kernel is None:
            return
        try:
            if n:
                kernel.km.interrupt_kernel()
                kernel.execute("%dist_stop", timeout=60)
        except Exception:  # noqa: BLE001 - the kernel goes either way
            pass
        finally:
            kernel.close()
