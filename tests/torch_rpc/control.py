"""The control of the world form: the same bodies in the same order in plain processes (no
nbdist) that start RPC once and keep it, so what persistence alone changes shows here too.

``run_control(tests, n, where)`` starts ``n`` processes (``python control.py``); each starts RPC
as the tests' fixture would, then runs each body after every rank has finished the one before
(a ``FileStore`` barrier). A test that no rank finishes within ``STALL`` seconds is recorded as
``hang``: the processes are killed and a fresh set goes on with the tests after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .outcome import collect, hang, kill_tree
from .pool import HERE, Test

__all__ = ["STALL", "run_control"]

STALL = 90.0  # seconds without a test finishing on every rank: the test hangs
STARTUP = 120.0  # more for the first test: n processes import torch and start RPC


def run_control(tests: list[Test], n: int, where: Path, python: str = sys.executable) -> dict:
    """``{test id: outcome}`` of every test, run in ``n`` plain processes."""
    (where / "out").mkdir(parents=True, exist_ok=True)
    tests_file = where / "tests.json"
    tests_file.write_text(json.dumps([{"cls": t.cls, "name": t.name} for t in tests]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDIST")}
    env["PYTHONPATH"] = str(HERE)
    results: dict = {}
    start = 0
    while start < len(tests):
        log = open(where / f"log{start}.txt", "w")  # noqa: SIM115 - closed below
        procs = [subprocess.Popen(
            [python, "-c", "import sys, control_main; control_main.main(*sys.argv[1:])",
             str(rank), str(n), str(where), str(tests_file), str(start)],
            cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            for rank in range(n)]
        try:
            start = _watch(procs, tests, n, where, start, results)
        finally:
            for p in procs:
                kill_tree(p.pid)
            for p in procs:
                p.wait(timeout=30)
            log.close()
    return results


def _watch(procs: list, tests: list[Test], n: int, where: Path, start: int,
           results: dict) -> int:
    """Collect outcomes as they come; the index to go on from once these processes end."""
    last = time.monotonic() + STARTUP  # the first test waits for every process's start too
    k = start
    while k < len(tests):
        done = collect(where / "out", tests[k], n)
        if done is not None:
            results[tests[k].id] = done
            k, last = k + 1, time.monotonic()
            continue
        if time.monotonic() - last > STALL or all(p.poll() is not None for p in procs):
            results[tests[k].id] = hang(where / "out", tests[k], n, STALL)
            return k + 1
        time.sleep(0.05)
    return k
