"""The reference of the script form: torch's own launcher (``MultiProcessTestCase``: a fresh
process per rank per test), plain torch, nothing of nbdist, through ``launch_main.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .outcome import kill_tree
from .pool import HERE, Test

__all__ = ["run_launcher"]

PER_TEST = 240.0  # seconds a launched test may take, its processes' start included


def run_launcher(tests: list[Test], where: Path,
                 python: str = sys.executable) -> tuple[dict, float]:
    """(``{test id: outcome}``, seconds) for ``tests`` run by torch's launcher, one at a time."""
    where.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDIST")}
    env["PYTHONPATH"] = str(HERE)
    results: dict = {}
    t0 = time.monotonic()
    pending = list(tests)
    while pending:
        ids = [t.id for t in pending]
        out = where / f"launched{len(results)}.jsonl"
        log = open(where / f"launched{len(results)}.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([python, "launch_main.py", str(out), *ids], cwd=HERE, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait(proc, out, len(ids))
        finally:
            kill_tree(proc.pid)
            proc.wait(timeout=30)
            log.close()
        for line in out.read_text().splitlines() if out.exists() else ():
            rec = json.loads(line)
            results[rec["id"]] = rec["outcome"]
        done = [t for t in pending if t.id in results]
        if not done:  # the first one hung past PER_TEST: recorded as such, the rest go on
            results[pending[0].id] = {"outcome": "hang", "errors": [],
                                      "detail": f"torch's launcher ran past {PER_TEST:g}s"}
        pending = [t for t in pending if t.id not in results]
    return results, time.monotonic() - t0


def _wait(proc: subprocess.Popen, out: Path, n: int) -> None:
    """Until ``proc`` ends, or its current test runs past ``PER_TEST``."""
    seen, since = 0, time.monotonic()
    while proc.poll() is None:
        lines = len(out.read_text().splitlines()) if out.exists() else 0
        if lines != seen:
            seen, since = lines, time.monotonic()
        if time.monotonic() - since > PER_TEST:
            return
        time.sleep(0.2)
