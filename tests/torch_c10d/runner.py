"""Run one of torch's shipped c10d tests on one rank, as torch's launcher runs it, and record
how it ended. Imported by every rank of both sides (a world's ranks, and the processes torch's
launcher spawns through ``launch_main.py``): plain torch only, nothing of nbdist.

``TestDistBackendWithSpawn`` is the class torch's ``test_distributed_spawn.py`` defines.
``run_one`` calls its ``_run`` as a spawned rank does: the test as written, its own
``init_process_group`` ... ``destroy_process_group`` and ``sys.exit`` included.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import traceback
from pathlib import Path

import torch
from torch.testing._internal.common_distributed import TEST_SKIPS

for _k, _v in {"BACKEND": "gloo", "WORLD_SIZE": "4"}.items():  # pool.ENV (torch reads them
    os.environ.setdefault(_k, _v)  # as its test module is imported)

from torch.testing._internal.common_utils import FILE_SCHEMA  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    Barrier,
    DistributedTest,
    TestDistBackend,
)

__all__ = ["CLASSES", "DistributedTest", "TestDistBackendWithSpawn", "merge", "prepare", "run_one"]

torch.backends.cuda.matmul.allow_tf32 = False  # as test_distributed_spawn.py sets it


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """test_distributed_spawn.py's class: each test in a fresh process per rank."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


CLASSES: dict[str, type] = {"TestDistBackendWithSpawn": TestDistBackendWithSpawn}
_SKIP_CODES = {s.exit_code: s.message for s in TEST_SKIPS.values()}


def prepare(temp_dir: str) -> None:
    """What torch's launcher gives each spawned rank of a test: the test's own ``TEMP_DIR``
    (``barrier``, ``test_dir``, ``init_dir`` in it: the launcher's ``setUp`` makes them) and
    ``INIT_METHOD`` in the environment, and a fresh process's barrier count."""
    os.environ["TEMP_DIR"] = temp_dir
    os.environ["INIT_METHOD"] = FILE_SCHEMA + os.path.join(temp_dir, "init_dir",
                                                           "shared_init_file")
    Barrier.barrier_id = 0


def _raised(text: str) -> str:
    """The exception type a traceback ends with."""
    lines = [ln for ln in text.strip().splitlines() if ln and not ln.startswith(" ")]
    return lines[-1].split(":")[0].rsplit(".", 1)[-1] if lines else "unknown"


def run_one(name: str, rank: int, temp_dir: str, file_name: str, out: str | None = None,
            raise_: bool = False) -> dict:
    """Run the test on this rank as a spawned process of torch's launcher does; its outcome
    (``{"outcome": "pass" | "skip" | "fail", "code": exit code, "error": type name, "detail":
    text}``) is returned and, with ``out``, written to ``out/<class>.<test>.<rank>.json``.
    ``raise_``: an error exit is raised again after that (it ends the cell, as it ends the
    process); a skip exit or a clean one is not: a rank that skips ends as any other rank."""
    prepare(temp_dir)
    ours, theirs = multiprocessing.Pipe()  # the launcher's pipe: run_test sends a traceback
    failure: BaseException | None = None
    try:
        TestDistBackendWithSpawn._run(rank, name, file_name, theirs)
        result = {"outcome": "fail", "code": None, "error": "NoExit",
                  "detail": "_run returned without sys.exit"}
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if code == 0:
            result = {"outcome": "pass", "code": 0}
        elif code in _SKIP_CODES:
            result = {"outcome": "skip", "code": code, "detail": _SKIP_CODES[code]}
        else:
            sent = ours.recv() if ours.poll(1) else ""
            result = {"outcome": "fail", "code": code, "error": _raised(sent) if sent
                      else "SystemExit", "detail": (sent or f"exit code {code}")[-3000:]}
            failure = exc
    except BaseException as exc:  # noqa: BLE001 - raised outside the test: its outcome
        failure = exc
        result = {"outcome": "fail", "code": None, "error": type(exc).__name__,
                  "detail": "".join(traceback.format_exception(exc))[-3000:]}
    finally:
        ours.close()
        if out is not None:  # read by the harness, which waits for every rank's
            (Path(out) / f"TestDistBackendWithSpawn.{name}.{rank}.json").write_text(
                json.dumps(result))
    if raise_ and failure is not None:
        raise failure
    return result


def merge(per_rank: dict[int, dict]) -> dict:
    """One outcome from each rank's, as ``MultiProcessTestCase._check_return_codes`` judges
    exit codes: an error exit on any rank fails the test; else rank 0's skip code skips it;
    else rank 0's code must be 0."""
    fails = {r: o for r, o in per_rank.items() if o["outcome"] == "fail"}
    if fails:
        return {"outcome": "fail", "errors": sorted(f"r{r} {o['error']}" for r, o in fails.items()),
                "detail": "\n".join(f"[rank {r}] {o.get('detail', '')}"
                                    for r, o in sorted(fails.items()))[-4000:]}
    first = per_rank.get(0, {"outcome": "fail", "code": None})
    if first["outcome"] == "skip":
        return {"outcome": "skip", "errors": [], "detail": first.get("detail", "")}
    return {"outcome": "pass", "errors": [], "detail": ""}
