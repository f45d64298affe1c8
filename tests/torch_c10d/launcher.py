"""The reference of the script form: torch's own launcher (a fresh process per rank per test,
plain torch, nothing of nbdist) through ``launch_main.py``, one test at a time. Each outcome is
handed to ``on_result`` as it comes, so that a long run can be recorded as it goes (and
resumed: ``suite.py --resume``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from torch_rpc.outcome import kill_tree

from .pool import ENV, HERE, Test

__all__ = ["PER_TEST", "run_launcher"]

PER_TEST = 300.0  # seconds a launched test may take (its 4 spawned ranks' start included)


def run_launcher(tests: list[Test], where: Path, on_result: Callable[[str, dict, float], None]
                 | None = None, python: str = sys.executable) -> tuple[dict, dict]:
    """(``{test id: outcome}``, ``{test id: seconds}``) for ``tests`` under torch's launcher."""
    where.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDIST")}
    env.update(ENV, PYTHONPATH=str(HERE))
    results: dict = {}
    seconds: dict = {}
    pending = list(tests)
    while pending:
        out = where / f"launched{len(results)}.jsonl"
        log = open(where / f"launched{len(results)}.log", "w")  # noqa: SIM115 - closed below
        t0 = time.monotonic()
        proc = subprocess.Popen([python, "launch_main.py", str(out), *(t.name for t in pending)],
                                cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            _wait(proc, out, results, seconds, on_result)
        finally:
            kill_tree(proc.pid)
            proc.wait(timeout=30)
            log.close()
        _read(out, results, seconds, on_result)
        if pending[0].id not in results:  # it hung past PER_TEST: recorded so, the rest go on
            gone = time.monotonic() - t0 - sum(seconds.get(t.id, 0) for t in pending)
            _take(pending[0].id, {"outcome": "hang", "errors": [], "detail": "torch's "
                  f"launcher ran past {PER_TEST:g}s"}, gone, results, seconds, on_result)
        pending = [t for t in pending if t.id not in results]
    return results, seconds


def _take(test_id: str, outcome: dict, s: float, results: dict, seconds: dict,
          on_result: Callable | None) -> None:
    if test_id in results:
        return
    results[test_id], seconds[test_id] = outcome, s
    if on_result is not None:
        on_result(test_id, outcome, s)


def _read(out: Path, results: dict, seconds: dict, on_result: Callable | None) -> int:
    lines = out.read_text().splitlines() if out.exists() else []
    for line in lines:
        rec = json.loads(line)
        _take(rec["id"], rec["outcome"], rec["seconds"], results, seconds, on_result)
    return len(lines)


def _wait(proc: subprocess.Popen, out: Path, results: dict, seconds: dict,
          on_result: Callable | None) -> None:
    """Until ``proc`` ends, or its current test runs past ``PER_TEST``."""
    seen, since = 0, time.monotonic()
    while proc.poll() is None:
        lines = _read(out, results, seconds, on_result)
        if lines != seen:
            seen, since = lines, time.monotonic()
        if time.monotonic() - since > PER_TEST:
            return
        time.sleep(0.5)
