"""Run torch's c10d tests from one real kernel, cell by cell, as a user re-runs a cell: a
``--no-rpc`` world of 4 ranks (the notebook is rank 0); each test runs as written in one
``%%dist --local`` cell on every rank. A rank's error exit ends its cell (as it ends a
launched process), so that nbdist's fail-fast stops the others as torch's launcher terminates
them; a skip exit does not (a rank that skips ends its run as one that passes). Before each
cell the harness makes what torch's launcher's ``setUp`` makes (the test's ``TEMP_DIR`` and
its ``file_name``), and after it removes them, as its ``tearDown`` does. The kernel, the world
and the hang handling are tests/torch_rpc's script form's (``WorldSide``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from torch_rpc.world import WorldSide

from .pool import HERE, Test
from .runner import merge

__all__ = ["C10dWorld"]

_SETUP = """%%dist --local
import os, sys
sys.path.insert(0, {here!r})
from runner import run_one as _torch_c10d_run
"""
_CELL = """%%dist --local
_torch_c10d_run({name!r}, int(os.environ["RANK"]), {temp!r}, {file!r}, {out!r}, True)
"""


class C10dWorld(WorldSide):
    """One kernel that runs c10d tests one after another in a 4-rank ``--no-rpc`` world."""

    merge = staticmethod(merge)  # as torch's launcher judges its ranks' exit codes

    def __init__(self) -> None:
        super().__init__("script")

    def _setup(self) -> str:
        return _SETUP.format(here=str(HERE))

    def _cell(self, k: int, t: Test, where: Path, out: Path) -> str:
        temp = where / f"t{k}"
        for sub in ("barrier", "test_dir", "init_dir"):  # as TestDistBackend.setUp makes them
            (temp / sub).mkdir(parents=True)
        file_name = where / f"file{k}"  # MultiProcessTestCase.setUp's file_name
        file_name.touch()
        return _CELL.format(name=t.name, temp=str(temp), file=str(file_name), out=str(out))

    def _done(self, k: int, where: Path) -> None:
        shutil.rmtree(where / f"t{k}", ignore_errors=True)  # tearDown's cleanup_temp_dir
        (where / f"file{k}").unlink(missing_ok=True)
