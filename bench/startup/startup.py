"""Time to a ready world: nbdist cold start and restart vs ipyparallel and mp.spawn + init_rpc.

``python bench/startup/startup.py [--quick]`` (part of ``make bench``). For N = 1, 2, 4, 8 workers
(``--quick``: 1 and 4, fewer repetitions) every contender is measured in the same run, taking
turns within each repetition (the order rotates), so that a busy spell of a shared machine
hits all of them:

- ``nbdist cold``: a fresh process that has imported torch times ``nbdist.start(N)`` with no
  template running (``_startup_child.py nbdist``); ``+ import torch`` adds its own ``import
  torch``, the figure for a notebook whose first cells are ``import torch`` and the start.
- ``nbdist warm``: ``nbdist.start(N)`` in this process, no world running, template warm
  (``%dist_stop`` then ``%dist_start``).
- ``nbdist restart``: ``c = c.restart(N)`` in this process, a world of N running.
- ``nbdist keep-restart``: ``c.restart(N, keep=True)`` (``%dist_restart --keep``): the N
  workers keep their processes and rejoin a rebuilt RPC world.
- ``nbdist heal``: in a world started with ``heal=True``, from the SIGKILL of rank 1 until
  its replacement answered and the world runs again (the others keep their state).
- ``mp spawn``: ``torch.multiprocessing`` spawn + ``init_rpc`` (``file://``), parent rank 0,
  until every child answered an ``rpc_sync``.
- ``ipyparallel``: ``ipp.Cluster(n=N).start_and_connect_sync()`` then ``import torch`` on all
  engines (``connect`` is the first part alone).

Ready means every rank answered an RPC (ipyparallel: every engine imported torch). Then a
trivial cell (``x = 1``) on 4 workers: nbdist ``Cluster.run(show=False)`` and ``%%dist``
through an IPython shell, against ipyparallel ``rc[:].execute(block=True)`` and ``%px``, in
interleaved blocks. Besides wall time, ``cpu`` is the CPU seconds (user + system) that the
whole process tree spent getting ready: on a shared machine it varies far less than wall time.

``--smoke``: N = 1, one of each but ipyparallel, a few cells, growth at N = 1 and 2, results
in a temporary directory: proves the script runs, in seconds.

Writes ``bench/results/startup.json`` and ``bench/results/startup.md`` (naming the commit
measured, ``-dirty`` when the sources differed from it), prints the table, the
ratios and the issue's targets (2 cores, N = 4: cold <= 3 s, restart <= 1 s, ``%%dist`` <= 5 ms
median, ipyparallel >= 3x slower to ready). Exits non-zero on any error or on a process left
behind; every process it starts is killed at the end, whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_startup_child.py"
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s

import _common  # noqa: E402
import _startup_phases as phases  # noqa: E402

__all__ = ["main"]

#: Contenders of the start-up rounds, in their base order (rotated per repetition).
ROUND = ("nbdist_cold", "nbdist_inproc", "mp_spawn", "ipyparallel")
LABELS = {
    "nbdist_cold": "nbdist cold",
    "nbdist_cold_import": "nbdist cold + import torch",
    "nbdist_warm": "nbdist warm start",
    "nbdist_restart": "nbdist restart",
    "nbdist_keep": "nbdist keep-restart",
    "nbdist_heal": "nbdist heal (kill to ready)",
    "mp_spawn": "mp spawn + init_rpc",
    "ipp_connect": "ipyparallel connect",
    "ipyparallel": "ipyparallel + import torch",
}
TARGETS = {"cold_s": 3.0, "restart_s": 1.0, "cell_ms": 5.0, "ipp_ratio": 3.0}


class BenchError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- processes
def _become_subreaper() -> bool:
    """Orphans of our children (ipyparallel engines, templates) become ours to find and reap."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except OSError:
        return False


def _descendants(exclude: set[int] = frozenset()) -> list[psutil.Process]:
    """Live descendants of this process, without those in ``exclude`` and their subtrees."""
    out = []
    for child in psutil.Process().children():
        if child.pid in exclude:
            continue
        out.append(child)
        try:
            out.extend(child.children(recursive=True))
        except psutil.Error:
            pass
    return [p for p in out if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def _reap_zombies() -> None:
    """Collect exited orphans that were handed to us as subreaper (never our Popen children)."""
    for p in psutil.Process().children():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


def _own_template() -> set[int]:
    from nbdist.cluster.session import session
    _cl = session()

    t = _cl.template
    return {t.pid} if t is not None and t.pid is not None and t.alive() else set()


def _sweep(what: str, leftovers: dict[str, int], grace: float = 10.0) -> None:
    """Wait for processes a contender left behind to end by themselves; kill the rest."""
    deadline = time.monotonic() + grace
    while True:
        _reap_zombies()
        left = _descendants(_own_template())
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if left:
        names = ", ".join(f"{p.pid}:{_cmd(p)}" for p in left)
        print(f"  ! {what}: {len(left)} process(es) still running {grace:g}s after it finished, "
              f"killed: {names}", flush=True)
        leftovers[what] = leftovers.get(what, 0) + len(left)
        _kill(left)
        _reap_zombies()


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[1:4])[:80]
    except psutil.Error:
        return "?"


def _run_child(mode: str, n: int, timeout: float, env: dict, logdir: Path) -> dict:
    """Run one ``_startup_child.py`` measurement; its ``RESULT`` dict."""
    log = logdir / f"{mode}-{n}-{time.monotonic_ns()}.stderr"
    with open(log, "w+") as err:
        proc = subprocess.Popen([sys.executable, str(CHILD), mode, str(n)], stdout=subprocess.PIPE,
                                stderr=err, stdin=subprocess.DEVNULL, text=True, env=env,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except BaseException:
            _kill([psutil.Process(proc.pid), *_safe_children(proc.pid)])
            proc.wait()
            raise
        err.seek(0)
        tail = err.read()[-3000:]
    for line in out.splitlines():
        if line.startswith("RESULT "):
            if proc.returncode != 0:
                break
            return json.loads(line[7:])
    raise BenchError(f"{mode} N={n}: child exited with {proc.returncode}; stderr:\n{tail}")


def _safe_children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


class _LineReader:
    """Lines of a child's stdout, read by a thread, taken with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self.q.put(line)
        self.q.put(None)

    def take(self, prefix: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.q.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise BenchError(f"no {prefix} line from the ipyparallel child in "
                                 f"{timeout:g}s") from None
            if line is None:
                raise BenchError(f"the ipyparallel child ended before its {prefix} line")
            if line.startswith(prefix + " "):
                return json.loads(line[len(prefix) + 1:])


# ----------------------------------------------------------------------------- measuring
_tree_cpu = _common.tree_cpu


class Bench:
    def __init__(self, args: argparse.Namespace, env: dict, logdir: Path, src: Path) -> None:
        self.args, self.env, self.logdir, self.src = args, env, logdir, src
        self.samples: dict[str, dict[int, list[float]]] = {}
        self.cpu: dict[str, dict[int, list[float]]] = {}
        self.phases: dict[str, dict[int, list[dict]]] = {}
        self.extra: dict[str, dict[int, list[dict]]] = {}
        self.loads: list[float] = []
        self.leftovers: dict[str, int] = {}
        self.cluster: Any = None
        self.cell: dict[str, list[float]] = {}

    def add(self, key: str, n: int, seconds: float, cpu: float | None = None,
            phase: dict | None = None, **extra: Any) -> None:
        self.samples.setdefault(key, {}).setdefault(n, []).append(seconds)
        if cpu is not None:
            self.cpu.setdefault(key, {}).setdefault(n, []).append(cpu)
        if phase:
            self.phases.setdefault(key, {}).setdefault(n, []).append(phase)
        if extra:
            self.extra.setdefault(key, {}).setdefault(n, []).append(extra)

    # -- contenders --------------------------------------------------------------------------
    def nbdist_cold(self, n: int) -> str:
        r = _run_child("nbdist", n, self.args.timeout, self.env, self.logdir)
        _sweep("nbdist cold", self.leftovers)
        _check_snapshot(self.src, "a cold-start child", r["nbdist_file"])
        self.add("nbdist_cold", n, r["start"], r["cpu"], r["phases"],
                 startup_seconds=r["startup_seconds"], stop=r["stop"])
        self.add("nbdist_cold_import", n, r["start"] + r["import_torch"] + r["import_nbdist"],
                 import_torch=r["import_torch"], import_nbdist=r["import_nbdist"])
        return f"cold {r['start']:.2f}s (+import torch {r['import_torch']:.2f}s)"

    def nbdist_inproc(self, n: int) -> str:
        import nbdist

        warm = bool(_own_template())
        since = time.perf_counter()
        cpu0 = _tree_cpu()
        self.cluster = nbdist.start(n, quiet=True)
        t = time.perf_counter() - since
        cpu = _tree_cpu() - cpu0
        if warm:
            self.add("nbdist_warm", n, t, cpu, phases.breakdown(since))
        times = []
        for _ in range(self.args.restarts):
            since = time.perf_counter()
            cpu0 = _tree_cpu()
            self.cluster = self.cluster.restart(n, quiet=True)
            dt = time.perf_counter() - since
            self.add("nbdist_restart", n, dt, _tree_cpu() - cpu0, phases.breakdown(since))
            times.append(dt)
        kept = []
        for _ in range(self.args.restarts):
            since = time.perf_counter()
            cpu0 = _tree_cpu()
            self.cluster.restart(n, keep=True, quiet=True)
            dt = time.perf_counter() - since
            self.add("nbdist_keep", n, dt, _tree_cpu() - cpu0)
            kept.append(dt)
        healed = self._heal_once(n)
        t0 = time.perf_counter()
        self.cluster.stop()
        self.add("nbdist_stop", n, time.perf_counter() - t0)
        self.cluster = None
        return (f"warm {t:.2f}s{'' if warm else ' (template was cold)'}, restart "
                + "/".join(f"{x:.2f}" for x in times) + "s, keep "
                + "/".join(f"{x:.2f}" for x in kept) + f"s, heal {healed:.2f}s")

    def _heal_once(self, n: int) -> float:
        """Seconds from killing rank 1 of a healing world to its replacement's readiness."""
        c = self.cluster
        c.restart(n, keep=True, heal=True, quiet=True)
        old = c.ranks[1].pid
        since = time.perf_counter()
        cpu0 = _tree_cpu()
        os.kill(old, signal.SIGKILL)
        while not (c.running and c.ranks[1].pid != old and c.ranks[1].ready):
            if time.perf_counter() - since > self.args.timeout:
                raise BenchError(f"--heal did not replace rank 1 within {self.args.timeout}s")
            time.sleep(0.002)
        dt = time.perf_counter() - since
        self.add("nbdist_heal", n, dt, _tree_cpu() - cpu0)
        c.restart(n, keep=True, heal=False, quiet=True)
        return dt

    def mp_spawn(self, n: int) -> str:
        r = _run_child("mp", n, self.args.timeout, self.env, self.logdir)
        _sweep("mp spawn", self.leftovers)
        self.add("mp_spawn", n, r["start"], r["cpu"], init_rpc=r["init_rpc"], ping=r["ping"],
                 stop=r["stop"])
        return f"mp {r['start']:.2f}s"

    def ipyparallel(self, n: int) -> str:
        r = _run_child("ipp", n, self.args.timeout, self.env, self.logdir)
        _sweep("ipyparallel", self.leftovers)
        self.add("ipyparallel", n, r["start"], r["cpu"], stop=r["stop"])
        self.add("ipp_connect", n, r["connect"])
        return f"ipp {r['connect']:.2f}+{r['import_torch']:.2f}s"

    # -- rounds ------------------------------------------------------------------------------
    def startup_rounds(self) -> None:
        contenders = tuple(c for c in ROUND if c != "ipyparallel" or not self.args.no_ipp)
        for i, n in enumerate(self.args.workers):
            for rep in range(self.args.reps):
                k = (rep + i) % len(contenders)
                order = contenders[k:] + contenders[:k]
                notes = []
                for name in order:
                    self.loads.append(os.getloadavg()[0])
                    notes.append(getattr(self, name)(n))
                print(f"N={n} rep {rep + 1}/{self.args.reps} (load {os.getloadavg()[0]:.1f}): "
                      + "; ".join(notes), flush=True)

    def cell_round_trip(self, n: int = 4) -> None:
        """``x = 1`` on n workers: nbdist API and %%dist vs ipyparallel API and %px."""
        from IPython.core.interactiveshell import InteractiveShell

        import nbdist

        shell = InteractiveShell.instance(config=_shell_config())
        nbdist.load_ipython_extension(shell)
        self.cluster = nbdist.start(n, quiet=True)
        c = self.cluster

        def nb_api() -> None:
            c.run("x=1", show=False)

        def nb_magic() -> None:
            res = shell.run_cell("%%dist\nx=1\n", store_history=False)
            if not res.success:
                raise BenchError(f"%%dist failed: {res.error_in_exec!r}")

        ipp = not self.args.no_ipp
        err = open(self.logdir / "ipp-serve.stderr", "w")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, str(CHILD), "ipp-serve", str(n)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True, env=self.env, start_new_session=True) if ipp else None
        try:
            lines = _LineReader(proc.stdout) if proc is not None else None
            if lines is not None:
                lines.take("READY", self.args.timeout)

            def remote(cmd: str, k: int) -> list[float]:
                assert proc is not None and proc.stdin is not None and lines is not None
                proc.stdin.write(f"{cmd} {k}\n")
                proc.stdin.flush()
                return lines.take("TIMES", self.args.timeout)

            def local(fn: Any, k: int) -> list[float]:
                out = []
                for _ in range(k):
                    t = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - t)
                return out

            kinds = {
                "nbdist_run": lambda k: local(nb_api, k),
                "nbdist_magic": lambda k: local(nb_magic, k),
            }
            if ipp:
                kinds["ipp_execute"] = lambda k: remote("api", k)
                kinds["ipp_px"] = lambda k: remote("magic", k)
            for fn in kinds.values():  # warm-up, not counted
                fn(10)
            block = 20
            names = list(kinds)
            for b in range(max(self.args.cells // block, 1)):
                k = b % len(names)
                for name in names[k:] + names[:k]:
                    self.cell.setdefault(name, []).extend(kinds[name](block))
            if proc is not None:
                assert proc.stdin is not None
                proc.stdin.write("quit\n")
                proc.stdin.flush()
                proc.wait(60)
                if proc.returncode != 0:
                    raise BenchError(f"the ipyparallel child exited with {proc.returncode}")
        finally:
            if proc is not None:
                if proc.poll() is None:
                    _kill([psutil.Process(proc.pid), *_safe_children(proc.pid)])
                proc.wait()
            err.close()
            self.cluster.stop()
            self.cluster = None
            _sweep("ipyparallel (cells)", self.leftovers)
        med = {k: statistics.median(v) * 1e3 for k, v in self.cell.items()}
        print(f"cell x=1 on {n} workers, median ms: "
              + ", ".join(f"{k} {v:.2f}" for k, v in med.items()), flush=True)


def _shell_config() -> Any:
    """An IPython shell that keeps its history in memory (nothing written to IPYTHONDIR)."""
    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    return cfg


# ----------------------------------------------------------------------------- reporting
def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs),
            "samples": [round(x, 4) for x in xs]}


def _median_phases(rows: list[dict]) -> dict:
    keys = [p for p in phases.PHASES if any(p in r for r in rows)]
    return {k: round(statistics.median(r.get(k, 0.0) for r in rows), 4) for k in keys}


def summarize(b: Bench, info: dict) -> dict:
    ns = b.args.workers
    start = {k: {n: _stats(v[n]) for n in ns if n in v} for k, v in b.samples.items()}
    cpu = {k: {n: _stats(v[n]) for n in ns if n in v} for k, v in b.cpu.items()}
    med = {k: {n: s["median"] for n, s in v.items()} for k, v in start.items()}

    def ratio(a: str, c: str, n: int) -> float | None:
        if n in med.get(a, {}) and n in med.get(c, {}) and med[c][n] > 0:
            return med[a][n] / med[c][n]
        return None

    ratios = {n: {"ipyparallel/nbdist_cold": ratio("ipyparallel", "nbdist_cold", n),
                  "ipyparallel/nbdist_restart": ratio("ipyparallel", "nbdist_restart", n),
                  "mp_spawn/nbdist_cold": ratio("mp_spawn", "nbdist_cold", n),
                  "mp_spawn/nbdist_restart": ratio("mp_spawn", "nbdist_restart", n),
                  "nbdist_restart/nbdist_keep": ratio("nbdist_restart", "nbdist_keep", n)}
              for n in ns}
    cell = {k: {kk: vv * 1e3 if kk != "n" and kk != "samples" else vv
                for kk, vv in _stats(v).items() if kk != "samples"} for k, v in b.cell.items()}
    targets = {}
    if 4 in ns:
        cold = med.get("nbdist_cold", {}).get(4)
        rst = med.get("nbdist_restart", {}).get(4)
        r4 = ratios[4]["ipyparallel/nbdist_cold"]
        magic = cell.get("nbdist_magic", {}).get("median")
        targets = {
            "cold_start_s": {"target": f"<= {TARGETS['cold_s']}", "measured": cold,
                             "met": cold is not None and cold <= TARGETS["cold_s"]},
            "restart_s": {"target": f"<= {TARGETS['restart_s']}", "measured": rst,
                          "met": rst is not None and rst <= TARGETS["restart_s"]},
            "dist_cell_ms": {"target": f"<= {TARGETS['cell_ms']}", "measured": magic,
                             "met": magic is not None and magic <= TARGETS["cell_ms"]},
            "ipyparallel_over_nbdist_cold": {
                "target": f">= {TARGETS['ipp_ratio']}", "measured": r4,
                "met": r4 is not None and r4 >= TARGETS["ipp_ratio"]},
        }
    return {
        "machine": info,
        "settings": {"workers": ns, "reps": b.args.reps, "restarts_per_rep": b.args.restarts,
                     "cells": b.args.cells, "quick": b.args.quick, "smoke": b.args.smoke},
        "start_seconds": start,
        "cpu_seconds": cpu,
        "phases_median_seconds": {k: {n: _median_phases(v[n]) for n in ns if n in v}
                                  for k, v in b.phases.items()},
        "extra": b.extra,
        "ratios": ratios,
        "cell_round_trip_ms": cell,
        "targets_n4": targets,
        "leftover_processes_killed": b.leftovers,
        "load_1m_during": _stats(b.loads) if b.loads else None,
    }


def _fmt(x: float | None, unit: str = "s", digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}{unit}"


def render(res: dict) -> str:
    m = res["machine"]
    ns = res["settings"]["workers"]
    st, cpu = res["start_seconds"], res["cpu_seconds"]
    lines = [
        "# Start-up benchmark (bench/startup/startup.py)",
        "",
        f"{m['date']} · {m['cores']} cores · load average (1m) {m['load_start'][0]:.1f} at start, "
        f"{m['load_end'][0]:.1f} at end · torch {m['torch']} · ipyparallel {m['ipyparallel']} "
        f"· Python {m['python']} · {m['platform']} · nbdist at {res.get('commit', '?')}"
        + (f" with uncommitted changes to {', '.join(m['nbdist']['modified_files'])}"
           if m["nbdist"].get("modified_files") else ""),
        f"{res['settings']['reps']} repetitions per contender and N, contenders interleaved "
        f"(nbdist restart: {res['settings']['restarts_per_rep']} per repetition); median "
        "seconds to ready, min–max in brackets.",
        "",
    ]
    for problem in (res.get("error"), m.get("warning")):
        if problem:
            lines += [f"**Not a valid run:** {problem.strip().splitlines()[-1]}", ""]
    keys = [k for k in LABELS if k in st]
    lines.append("| N | " + " | ".join(LABELS[k] for k in keys) + " |")
    lines.append("|---" * (len(keys) + 1) + "|")
    for n in ns:
        cells = []
        for k in keys:
            s = st[k].get(n) if k in st else None
            cells.append("—" if s is None else f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios of medians (how many times longer than nbdist):", "",
              "| N | ipyparallel / nbdist cold | ipyparallel / nbdist restart "
              "| mp spawn / nbdist cold | mp spawn / nbdist restart "
              "| nbdist restart / keep-restart |", "|---|---|---|---|---|---|"]
    for n in ns:
        r = res["ratios"][n]
        lines.append(f"| {n} | " + " | ".join(_fmt(r.get(k), "x", 1) for k in (
            "ipyparallel/nbdist_cold", "ipyparallel/nbdist_restart", "mp_spawn/nbdist_cold",
            "mp_spawn/nbdist_restart", "nbdist_restart/nbdist_keep")) + " |")
    ckeys = [k for k in LABELS if k in cpu]
    lines += ["", "CPU seconds (user + system, whole process tree) spent getting ready, median "
              "(less sensitive to the machine's load than wall time):", "",
              "| N | " + " | ".join(LABELS[k] for k in ckeys) + " |",
              "|---" * (len(ckeys) + 1) + "|"]
    for n in ns:
        lines.append(f"| {n} | " + " | ".join(
            _fmt(cpu[k][n]["median"] if n in cpu[k] else None) for k in ckeys) + " |")
    ph = res["phases_median_seconds"]
    if ph:
        cols = [p for p in phases.PHASES if any(p in v for d in ph.values() for v in d.values())]
        lines += ["", "Where nbdist's time goes (median seconds per phase; see "
                  "bench/startup/_startup_phases.py):", "",
                  "| start | N | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
        for k in ("nbdist_cold", "nbdist_warm", "nbdist_restart"):
            for n in ns:
                d = ph.get(k, {}).get(n)
                if d:
                    lines.append(f"| {LABELS[k]} | {n} | "
                                 + " | ".join(_fmt(d.get(p)) for p in cols) + " |")
    cell = res["cell_round_trip_ms"]
    if cell:
        names = {"nbdist_run": "nbdist `Cluster.run('x=1', show=False)`",
                 "nbdist_magic": "nbdist `%%dist` (IPython shell)",
                 "ipp_execute": "ipyparallel `rc[:].execute('x=1', block=True)`",
                 "ipp_px": "ipyparallel `%px x=1` (IPython shell)"}
        lines += ["", f"A trivial cell (`x = 1`) on {4 if 4 in ns else ns[-1]} workers, "
                  "ms per cell:", "",
                  "| how | median | min | max | runs |", "|---|---|---|---|---|"]
        for k, s in cell.items():
            lines.append(f"| {names.get(k, k)} | {s['median']:.2f} | {s['min']:.2f} | "
                         f"{s['max']:.2f} | {s['n']} |")
    if res["targets_n4"]:
        lines += ["", "Targets (N = 4):", "", "| target | wanted | measured | met |",
                  "|---|---|---|---|"]
        units = {"cold_start_s": "s", "restart_s": "s", "dist_cell_ms": " ms",
                 "ipyparallel_over_nbdist_cold": "x"}
        for k, t in res["targets_n4"].items():
            lines.append(f"| {k} | {t['target']} | {_fmt(t['measured'], units[k])} | "
                         f"{'yes' if t['met'] else 'NO'} |")
    if res["leftover_processes_killed"]:
        lines += ["", f"Processes left behind and killed: {res['leftover_processes_killed']}"]
    lines += ["", "nbdist ran from a copy of the working tree's `nbdist/` taken at the start of "
              "the run; ready = every rank answered an RPC (ipyparallel: every engine imported "
              "torch)."]
    return "\n".join(lines) + "\n"


def _snapshot(dest: Path) -> Path:
    """Copy nbdist's sources to ``dest/nbdist`` and make this run and its children use them.

    The working tree is shared and changes under a long run; the copy keeps every contender on
    one version. This process and its children run in ``dest`` (``python -m nbdist.proc.template``
    puts the working directory first on ``sys.path``) with ``dest`` first on ``PYTHONPATH``.
    """
    shutil.copytree(HERE.parents[1] / "nbdist", dest / "nbdist",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(dest))
    os.chdir(dest)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(dest), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")) if p)
    return dest


def _check_snapshot(src: Path, where: str, path: str | None) -> None:
    if path is None or not Path(path).resolve().is_relative_to(src.resolve()):
        raise BenchError(f"{where} ran nbdist from {path}, not from the snapshot in {src}")


def _nbdist_version() -> dict:
    """The commit the sources were copied at and the files modified in the working tree."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        root = str(HERE.parents[1])
        out["commit"] = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "nbdist"],
                               capture_output=True, text=True, timeout=10).stdout
        out["modified_files"] = sorted(line[3:] for line in dirty.splitlines())
    return out


def machine_info() -> dict:
    import ipyparallel
    import torch

    return {"nbdist": _nbdist_version(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "cores": os.cpu_count(), "load_start": list(os.getloadavg()),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "torch": torch.__version__, "ipyparallel": ipyparallel.__version__,
            "python": platform.python_version(), "platform": platform.platform(terse=True)}


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 1 and 4, fewer repetitions")
    ap.add_argument("--workers", type=int, nargs="+", default=None)
    ap.add_argument("--reps", type=int, default=None, help="repetitions per contender and N")
    ap.add_argument("--restarts", type=int, default=None, help="restarts per repetition")
    ap.add_argument("--cells", type=int, default=None, help="cells per contender (round trip)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    ap.add_argument("--no-ipp", action="store_true", help="leave ipyparallel out")
    ap.add_argument("--growth-only", action="store_true",
                    help="only N = 1..16 growth and the warm first start (startup_growth.*)")
    ap.add_argument("--no-growth", action="store_true", help="skip growth and first start")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    args.out = _common.out_dir(args)
    commit = _common.measured_commit()
    if args.growth_only:
        return _growth(args.out, args.quick, args.smoke, commit)
    if args.smoke:  # one of everything but ipyparallel (its start alone takes longer)
        args.workers, args.reps, args.restarts, args.cells = [1], 1, 1, 20
        args.no_ipp = True
    args.workers = args.workers or ([1, 4] if args.quick else [1, 2, 4, 8])
    args.reps = args.reps or (1 if args.quick else 3)
    args.restarts = args.restarts or 3
    args.cells = args.cells or (60 if args.quick else 200)

    t_begin = time.perf_counter()
    subreaper = _become_subreaper()
    tmp = Path(tempfile.mkdtemp(prefix="nbdist-bench-startup-"))
    # Nothing lands in ~/.ipython or ~/.local/share/jupyter; the template stays warm however
    # long the other contenders take.
    os.environ.update({"IPYTHONDIR": str(tmp / "ipython"),
                       "JUPYTER_RUNTIME_DIR": str(tmp / "jupyter-runtime"),
                       "NBDIST_TEMPLATE_IDLE": "86400"})
    logdir = tmp / "logs"
    logdir.mkdir()
    cwd = os.getcwd()
    info = machine_info()  # the commit and modified files first, then the copy
    src = _snapshot(tmp / "src")
    env = dict(os.environ)
    info["subreaper"] = subreaper
    print(f"start-up benchmark: N = {args.workers}, {args.reps} reps, {info['cores']} cores, "
          f"load {info['load_start'][0]:.1f}, torch {info['torch']}", flush=True)

    import nbdist

    phases.install()
    bench = Bench(args, env, logdir, src)
    error: str | None = None
    try:
        _check_snapshot(src, "this process", nbdist.__file__)
        nbdist.start(1, quiet=True).stop()  # warm this process's template up, untimed
        from nbdist.cluster.session import session
        _cl = session()

        assert _cl.template is not None and _cl.template.pid is not None
        _check_snapshot(src, "the template", psutil.Process(_cl.template.pid).cwd())
        bench.startup_rounds()
        if args.smoke:
            bench.cell_round_trip(1)
        elif 4 in args.workers or args.quick:
            bench.cell_round_trip(4)
    except BaseException as exc:  # noqa: BLE001 - report, clean up, exit non-zero
        error = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(f"benchmark failed:\n{error}", file=sys.stderr, flush=True)
    finally:
        error = _cleanup(bench, error)
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)

    info["load_end"] = list(os.getloadavg())
    info["wall_seconds"] = round(time.perf_counter() - t_begin, 1)
    res = summarize(bench, info)
    res["commit"] = commit
    res["error"] = error
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "startup.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render(res)
    (args.out / "startup.md").write_text(md)
    print()
    print(md)
    _print_verdict(res)
    print(f"wrote {args.out / 'startup.json'} and {args.out / 'startup.md'} "
          f"in {info['wall_seconds']:.0f}s")
    if not args.no_growth and _growth(args.out, args.quick, args.smoke, commit):
        return 1
    return 1 if error else 0


def _growth(out: Path, quick: bool, smoke: bool = False, commit: str = "unknown") -> int:
    """N = 1..16 growth and the warm first start (``_startup_growth``); stops what it starts."""
    import _startup_growth

    import nbdist
    from nbdist.cluster.session import session
    _cl = session()

    try:
        _startup_growth.run_and_write(out, quick, smoke, commit)
        return 0
    except Exception:  # noqa: BLE001 - report, clean up, exit non-zero
        traceback.print_exc()
        return 1
    finally:
        nbdist.stop()
        if _cl.template is not None:
            _cl.template.close()


def _cleanup(bench: Bench, error: str | None) -> str | None:
    """Stop nbdist here and its template, kill anything else still running; say what."""
    import nbdist
    from nbdist.cluster.session import session
    _cl = session()

    try:
        if bench.cluster is not None:
            bench.cluster.stop()
        nbdist.stop()
        if _cl.template is not None:
            _cl.template.close()
    except Exception as exc:  # noqa: BLE001
        error = (error or "") + f"\ncleanup: {exc!r}"
    _sweep("end of run", bench.leftovers, grace=10.0)
    left = _descendants()
    if left:
        with contextlib.suppress(Exception):
            for p in left:
                os.kill(p.pid, signal.SIGKILL)
        error = (error or "") + f"\nprocesses survived the cleanup: {[p.pid for p in left]}"
    return error


def _print_verdict(res: dict) -> None:
    for n, r in res["ratios"].items():
        print(f"N={n}: " + ", ".join(f"{k} {_fmt(v, 'x', 1)}" for k, v in r.items()))
    for k, t in res["targets_n4"].items():
        print(f"target {k} {t['target']}: {_fmt(t['measured'], '', 3)} "
              f"-> {'met' if t['met'] else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
