"""Steps of issue 45's life-cycle checks, run inside a notebook (a real kernel's cell, or an
in-process IPython shell): act at a chosen moment of a heal, then check that the processes
alive are exactly the ranks ``%dist_status`` lists and that ``nbdist.current()`` agrees.
``tests/kernel/test_lifecycle.py`` and ``bench/lifecycle/lifecycle_stress.py`` share them.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import psutil

import nbdist
from nbdist.cluster.session import session

__all__ = ["EXPECTED", "STEPS", "check", "children", "into_heal", "run_seed", "step"]

#: What a stress step may do (``step``); Ctrl-C of a cell and of a start are sent as SIGINT
#: to this process from a timer thread, as Jupyter's interrupt does.
STEPS = ("start", "stop", "restart", "keep", "grow", "shrink", "kill", "kill_stop",
         "kill_restart", "ctrl_c_cell", "ctrl_c_start")
#: The longest any one command may take: its own deadline (the world's start timeout, 60 s)
#: and slack for a loaded 2-core machine; a step past this waited past its deadline.
STEP_LIMIT = 70.0
#: A step longer than this is counted as long (``run_seed``'s "long"): before session 14, a
#: start after a rank died while rank 0 was inside a rebuild's ``init_rpc`` waited for it.
LONG = 10.0
#: Outcomes a step may have besides "ok": a command the state refuses, a Ctrl-C, a cell that
#: names a dead rank (--heal gives up on a rank killed 3 times in 60 s), a start a Ctrl-C
#: called off. Anything else (a timeout, "RPC is already initialized") is a failure.
EXPECTED = ("interrupted", "no world", "UsageError", "ClusterStateError", "DistCellError",
            "WorkerDiedError")


def children() -> list[int]:
    """The template's live children: every local worker process there is."""
    pid = session().template_pid()
    if pid is None:
        return []
    try:
        kids = psutil.Process(pid).children()
    except psutil.Error:
        return []
    out = []
    for p in kids:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            pass
    return sorted(out)


def into_heal(rank: int, delay: float, limit: float = 10.0) -> Any:
    """SIGKILL ``rank`` of the current world (started with ``--heal``), wait until its heal
    is under way, then ``delay`` seconds more; returns the world."""
    c = nbdist.current()
    assert c is not None, "no world"
    os.kill(c.ranks[rank].pid, signal.SIGKILL)
    end = time.monotonic() + limit
    while c.state.value not in ("healing", "starting"):  # "starting": before issue 45
        if time.monotonic() > end:
            raise AssertionError(f"the heal of rank {rank} did not begin in {limit}s")
        time.sleep(0.0005)
    time.sleep(delay)
    return c


def check(settle: float = 5.0) -> dict:
    """The invariant after a command: the live worker processes are the ranks the status
    table calls alive, ``nbdist.current()`` is a world exactly when there are any (a rank
    the world saw die may still be listed dead). Polls up to ``settle`` seconds (a death
    is seen a moment after the SIGKILL); returns what it saw, with ``ok``."""
    end = time.monotonic() + settle
    while True:
        c = nbdist.current()
        kids = children()
        listed: list[int] = []
        if c is not None:
            table = c.status()
            listed = sorted(r["pid"] for r in table.rows
                            if r["alive"] and r["rank"] not in (0, "-"))
        seen = {"state": c.state.value if c is not None else "none", "alive": kids,
                "listed": listed}
        seen["ok"] = kids == listed and (c is not None or not kids)
        if seen["ok"] or time.monotonic() > end:
            return seen
        time.sleep(0.05)


_TIMERS: list[Any] = []  # Ctrl-C timers of the step under way, cancelled when it returns


def _ctrl_c_after(seconds: float) -> None:
    import threading

    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    _TIMERS.append(timer)
    timer.start()


def step(ip: Any, kind: str, rng: random.Random) -> str:
    """Do one stress step in the IPython shell ``ip``; returns what happened, in a word or
    an error's first line (expected errors: a command the state refuses, a Ctrl-C)."""
    try:
        return _step(ip, kind, rng)
    finally:  # a Ctrl-C meant for this step must not land in the next one
        while _TIMERS:
            _TIMERS.pop().cancel()


def _step(ip: Any, kind: str, rng: random.Random) -> str:
    c = nbdist.current()
    n = rng.randint(1, 3)
    try:
        if kind == "start":
            ip.run_line_magic("dist_start", f"{n} --heal")
        elif kind == "stop":
            ip.run_line_magic("dist_stop", "")
        elif kind == "restart":
            ip.run_line_magic("dist_restart", f"{n}")
        elif kind in ("keep", "grow", "shrink"):
            size = c.spec.n if c is not None else n
            size = {"keep": size, "grow": size + 1, "shrink": max(size - 1, 1)}[kind]
            ip.run_line_magic("dist_restart", f"{min(size, 3)} --keep")
        elif kind.startswith("kill"):
            if c is None or not c.worker_pids():
                return "no world"
            rank = rng.choice([r for r in c.ranks if r and c.ranks[r].alive] or [1])
            if c.ranks[rank].alive:
                os.kill(c.ranks[rank].pid, signal.SIGKILL)
            time.sleep(rng.uniform(0.0, 0.4))  # into the heal, or not yet
            if kind == "kill_stop":
                ip.run_line_magic("dist_stop", "")
            elif kind == "kill_restart":
                ip.run_line_magic("dist_restart", f"{n}")
        elif kind == "ctrl_c_cell":
            if c is None:
                return "no world"
            _ctrl_c_after(rng.uniform(0.05, 0.3))
            try:
                c.run("import time\nfor _ in range(100): time.sleep(0.01)", show=False)
                time.sleep(2.0)  # the cell ended first: the Ctrl-C lands here
            except KeyboardInterrupt:
                return "interrupted"
        elif kind == "ctrl_c_start":
            _ctrl_c_after(rng.uniform(0.0, 0.5))
            try:
                if c is None:
                    ip.run_line_magic("dist_start", f"{n} --heal")
                else:
                    ip.run_line_magic("dist_restart", f"{n}")
                time.sleep(2.0)
            except KeyboardInterrupt:
                return "interrupted"
        return "ok"
    except KeyboardInterrupt:
        return "interrupted"
    except Exception as exc:  # noqa: BLE001 - a refused command is a result, checked after
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def run_seed(ip: Any, seed: int, steps: int, start: int = 2) -> dict:
    """``steps`` random steps of seed ``seed`` in the IPython shell ``ip`` (from a world of
    ``start`` workers), checking after each; stops at the first failure, and stops the world
    at the end. Returns ``{"seed", "steps", "failure", "counts", "seconds", "slowest",
    "long"}`` (long: steps over ``LONG`` seconds)."""
    import sys

    rng = random.Random(seed)
    counts: dict[str, int] = {}
    failure = None
    slowest = 0.0
    long = 0
    t_seed = time.monotonic()
    done = 0
    try:
        try:
            ip.run_line_magic("dist_start", f"{start} --heal")
        except Exception as exc:  # noqa: BLE001 - the last seed's leftovers: this seed fails
            failure = {"step": 0, "kind": "first start", "why": ["unexpected"],
                       "outcome": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        for i in range(steps if failure is None else 0):
            kind = rng.choice(STEPS)
            t0 = time.monotonic()
            outcome = step(ip, kind, rng)
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            long += took > LONG
            seen = check()
            counts[kind] = counts.get(kind, 0) + 1
            done = i + 1
            bad = [] if outcome == "ok" or outcome.startswith(EXPECTED) else ["unexpected"]
            if not seen["ok"]:
                bad.append("processes and status disagree")
            if took > STEP_LIMIT:
                bad.append(f"took {took:.1f}s")
            if bad:
                failure = {"step": i, "kind": kind, "outcome": outcome, "seen": seen,
                           "why": bad, "took": round(took, 2)}
                print(f"lifecycle seed {seed} failed at step {i}: {failure}", file=sys.stderr)
                break
    finally:
        try:
            ip.run_line_magic("dist_stop", "")
        except BaseException as exc:  # noqa: BLE001 - said, the seed fails
            failure = failure or {"step": done, "kind": "final stop", "outcome": repr(exc)}
    left = check(settle=5.0)
    if failure is None and left["alive"]:
        failure = {"step": done, "kind": "final stop", "outcome": "ok", "seen": left,
                   "why": ["workers left after the final stop"]}
    return {"seed": seed, "steps": done, "failure": failure, "counts": counts,
            "seconds": round(time.monotonic() - t_seed, 2), "slowest": round(slowest, 2),
            "long": long}
