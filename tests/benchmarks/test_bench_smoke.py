"""Benchmarks that cannot rot: every script in bench/ runs in its ``--smoke`` mode.

Each script runs as ``make bench`` runs it, in its own process, at tiny sizes, with its results
sent to a temporary directory (never ``bench/results``). The scripts run side by side under one
deadline; each must exit 0, leave no process behind, and write results that name the commit
they measured. Two guards keep the list honest: a new script under bench/ must be listed here
(or as a helper another script runs), and every file in ``bench/results`` must be one that
``make bench`` (or another listed target) writes, or the hand-kept ``notes.md``.
"""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, wait_until
from fakehosts import can_make_namespaces
from raybed import cannot_run as ray_cannot_run
from slurmbed import cannot_run as slurm_cannot_run

BENCH = ROOT / "bench"

#: script -> the results files it writes (``make bench`` runs each of these); a name may be a
#: pattern: rpc.py keeps one file per torch version and mode it measured.
SCRIPTS = {
    "startup/startup.py": ["startup.json", "startup.md", "startup_growth.json",
                           "startup_growth.md", "startup_growth.png"],
    "startup/_startup_whatif.py": ["startup_whatif.json"],
    "startup/against.py": ["against.json", "against.md"],
    "rpc/rpc.py": ["rpc-torch-*-*.json", "rpc.md"],
    "rpc/rpc.py --unpinned": ["rpc_unpinned.json", "rpc_unpinned.md"],
    "rpc/batching.py": ["batching.csv", "batching.png"],
    "rpc/metrics.py": ["metrics.json", "metrics.md"],
    "hosts/multihost.py": ["multihost.json", "multihost.md"],
    "cells/spmd.py": ["spmd.json", "spmd.md"],
    "gpu/gpu.py": ["gpu.json", "gpu.md"],
    "cells/output.py": ["output.json", "output.md"],
    "hosts/slurm.py": ["slurm.json", "slurm.md"],
    "hosts/ray.py": ["ray.json", "ray.md"],
    "shm/ps_shm.py": ["ps_shm.json", "ps_shm.md"],
    "shm/shm_fixed_cost.py": ["shm_fixed_cost.json", "shm_fixed_cost.md"],
    "shm/shm_medium.py": ["shm_medium.json", "shm_medium.md"],
    "cells/widgets.py": ["widgets.json", "widgets.md"],
    "cells/views.py": ["views.json", "views.md"],
    "startup/first_minute.py": ["first_minute.json", "first_minute.md"],
    "lifecycle/fail_fast.py": ["fail_fast.json", "fail_fast.md"],
    "lifecycle/lifecycle_stress.py": ["lifecycle_stress.json", "lifecycle_stress.md"],
    "scale/scale.py": ["scale.json", "scale.md", "scale.png"],
    "scale/starts.py": ["scale_starts.json", "scale_starts.md"],
}
#: Results other ``make`` targets write: target -> its results files (each named in its
#: recipe without the suffix). The conformance suite is not a bench script: it runs torch's
#: tests, and its whole pool takes hours.
OTHER_TARGETS = {"conformance-torch": ["torch_rpc_world.json", "torch_rpc_world.md",
                                       "torch_rpc_script.json", "torch_rpc_script.md",
                                       "torch_c10d_script.json", "torch_c10d_script.md"]}
#: Not run by the smoke test: the same code as another entry, one switch apart.
SAME_AS = {"rpc/rpc.py --unpinned": "rpc/rpc.py"}
#: Scripts with a ``__main__`` that other scripts run as their child processes.
HELPERS = {"startup/_startup_child.py", "_rpc_plain.py", "rpc/_raw_rpc.py",
           "scale/_scale_child.py"}
#: Results files kept by hand, not written by a script: notes.md holds the measurements and
#: history that module docstrings used to carry, under a heading per module.
HAND_KEPT = {"notes.md"}
#: Seconds one script's smoke run may take; AT_ONCE of them run side by side (all at once
#: outran the deadline on 2 cores once the list grew past 15).
DEADLINE = 300.0
AT_ONCE = 3
#: Scripts that run with nothing beside them: the Ray bed's nodes time out starting (Ray's own
#: startup wait) when two other scripts' worlds share the 2 cores.
ALONE = {"hosts/ray.py"}

pytestmark = pytest.mark.slow


def _has_main(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body)


def test_every_bench_script_is_smoke_tested_and_run_by_make_bench():
    scripts = {str(p.relative_to(BENCH)) for p in BENCH.rglob("*.py") if _has_main(p)}
    listed = {s.split()[0] for s in SCRIPTS}
    assert scripts - HELPERS == listed, "a bench script without a smoke test, or a stale name"
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    for script in SCRIPTS:
        assert re.search(rf"bench/{re.escape(script)}\b", recipe), f"make bench skips {script}"


def _matches(names: list[str], patterns: list[str]) -> bool:
    """Whether ``names`` are one file per pattern (rpc.py's smoke run: one torch, one mode)."""
    return len(names) == len(patterns) and all(
        sum(fnmatch.fnmatchcase(n, pat) for n in names) == 1 for pat in patterns)


def test_every_results_file_is_one_make_bench_writes():
    make = (ROOT / "Makefile").read_text()
    for target, files in OTHER_TARGETS.items():
        recipe = make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        for name in files:
            assert f"bench/results/{name.rsplit('.', 1)[0]}" in recipe, (target, name)
    written = [f for files in [*SCRIPTS.values(), *OTHER_TARGETS.values()] for f in files]
    present = {p.name for p in (BENCH / "results").iterdir()} - HAND_KEPT
    stray = sorted(n for n in present if not any(fnmatch.fnmatchcase(n, w) for w in written))
    assert not stray, f"results no bench script writes: {stray}"


def _session_procs(sid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


@pytest.mark.timeout(900)  # about 20 scripts, AT_ONCE at a time
def test_every_bench_script_runs_in_smoke_mode(tmp_path):
    multihost_why = can_make_namespaces()
    slurm_why = slurm_cannot_run()
    ray_why = ray_cannot_run()
    procs: dict[str, tuple[subprocess.Popen, Path, object]] = {}
    todo = [s for s in SCRIPTS if s not in SAME_AS
            # each says why and writes nothing, as make bench
            and not (s == "hosts/multihost.py" and multihost_why is not None)
            and not (s == "hosts/slurm.py" and slurm_why is not None)
            and not (s == "hosts/ray.py" and ray_why is not None)]
    started: dict[str, float] = {}
    took: dict[str, float] = {}  # seconds each ran (printed: where the test's time goes)
    try:
        while todo or any(p.poll() is None for p, _, _ in procs.values()):
            running = [s for s, (p, _, _) in procs.items() if p.poll() is None]
            for script in running:
                if time.monotonic() - started[script] > DEADLINE:
                    pytest.fail(f"{script} --smoke still running after {DEADLINE:g}s")
            while todo and len(running) < AT_ONCE:
                if running and (todo[0] in ALONE or any(r in ALONE for r in running)):
                    break  # an ALONE script waits for the others, and they for it
                script = todo.pop(0)
                name, *extra = script.split()
                out = tmp_path / script.replace("/", "_").replace(" ", "_").replace("--", "")
                log = open(tmp_path / f"{out.name}.log", "w")  # noqa: SIM115 - closed below
                procs[script] = (subprocess.Popen(
                    [sys.executable, str(BENCH / name), *extra, "--smoke", "--out", str(out)],
                    cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True), out, log)
                started[script] = time.monotonic()
                running.append(script)
            for script, (proc, _, _) in procs.items():
                if script not in took and proc.poll() is not None:
                    took[script] = time.monotonic() - started[script]
            time.sleep(0.2)
        print("smoke seconds:", ", ".join(f"{s} {t:.0f}" for s, t in
                                          sorted(took.items(), key=lambda kv: -kv[1])))
        failed = {s: (tmp_path / f"{o.name}.log").read_text()[-3000:]
                  for s, (p, o, _) in procs.items() if p.returncode != 0}
        assert not failed, "\n\n".join(f"{s} --smoke failed:\n{t}" for s, t in failed.items())
        for script, (proc, _, _) in procs.items():
            wait_until(lambda p=proc: not _session_procs(p.pid), 15,
                       f"the processes {script} --smoke started to end")
        for script, (_, out, _) in procs.items():
            names = sorted(p.name for p in out.iterdir())
            assert _matches(names, SCRIPTS[script]), (script, names)
            _assert_commit_named(out)
    finally:
        for proc, _, log in procs.values():
            for p in _session_procs(proc.pid):
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.close()


def _assert_commit_named(out: Path) -> None:
    """Each results file names the commit it measured (``abc1234`` or ``abc1234-dirty``)."""
    commit = re.compile(r"\b[0-9a-f]{7,}(-dirty)?\b")
    for f in out.iterdir():
        if f.suffix == ".png":
            text = f.read_bytes().decode("latin-1")
            assert re.search(r"nbdist bench at [0-9a-f]{7,}", text), f"{f.name}: no commit"
        else:
            text = f.read_text()
            assert "commit" in text or "nbdist at" in text, f"{f.name}: no commit"
            assert commit.search(text), f"{f.name}: no commit"
