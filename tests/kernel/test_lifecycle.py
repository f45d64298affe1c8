"""Issue 45: one owner of a world's life cycle. A stop, a restart or the process's exit that
comes while ``--heal`` rebuilds the world (right after a crash is announced, when users act)
ends in the state the user was told, in a real kernel: a stop stops every rank, the
replacement included, and the next start works; a restart gives a new world; an exit does not
wait out the heal. ``bench/lifecycle/lifecycle_stress.py`` runs each case 20 times; here a few."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from conftest import ROOT

ROUNDS = int(os.environ.get("NBDIST_LIFECYCLE_ROUNDS", "2"))
#: Where in the heal the command lands: at its start, and later (the replacement forked,
#: joining or already answering RPC: a heal takes 0.2 to 0.3 s here). A command that lands
#: after the heal ended (the world says so) meets a healed world: its "healed" line is right.
DELAYS = [0.0, 0.15, 0.09, 0.03, 0.12, 0.06, 0.18]
ACT = ("c = _lifecycle.into_heal(3, {delay})\n"
       "print('during the heal:', c.state.value == 'healing')\n"
       "get_ipython().run_line_magic({magic!r}, {arg!r})")

SETUP = f"""
import sys, time
sys.path.insert(0, {str(ROOT / "bench" / "lifecycle")!r})
import nbdist, _lifecycle
%load_ext nbdist
%dist_start 3 --heal
"""


@pytest.fixture
def nb(kernel):
    rep = kernel.execute(SETUP, timeout=180)
    assert rep.status == "ok", rep
    yield kernel
    kernel.execute("%dist_stop", timeout=60)


def _after(nb) -> dict:
    rep = nb.execute("time.sleep(1.0); print(repr(_lifecycle.check()))", timeout=60)
    assert rep.status == "ok", rep
    import ast

    return ast.literal_eval(rep.stdout.strip().splitlines()[-1]) | {"stderr": rep.stderr}


def test_stop_during_a_heal_stops_every_rank_and_the_next_start_works(nb):
    for i in range(ROUNDS):
        delay = DELAYS[i % len(DELAYS)]
        t0 = time.monotonic()
        rep = nb.execute(ACT.format(delay=delay, magic="dist_stop", arg=""), timeout=60)
        took = time.monotonic() - t0
        assert rep.status == "ok", rep
        assert "nbdist: stopped" in rep.stdout, rep
        assert "no world is running" not in rep.stdout, rep
        seen = _after(nb)
        assert seen["ok"] and seen["state"] == "none" and seen["alive"] == [], seen
        if "during the heal: True" in rep.stdout:  # called off: it says nothing after
            assert "healed" not in rep.stderr + seen["stderr"], (rep, seen)
        assert "could not replace" not in rep.stderr + seen["stderr"], (rep, seen)
        assert took < 15.0, took
        rep = nb.execute("%dist_start 3 --heal", timeout=120)
        assert rep.status == "ok", rep
        assert "4 ranks ready" in rep.stdout, rep


def test_restart_during_a_heal_gives_a_new_world(nb):
    for i in range(ROUNDS):
        delay = DELAYS[i % len(DELAYS)]
        rep = nb.execute(ACT.format(delay=delay, magic="dist_restart", arg="3"), timeout=120)
        assert rep.status == "ok", rep
        assert "4 ranks ready" in rep.stdout, rep
        seen = _after(nb)
        assert seen["ok"] and seen["state"] == "running" and len(seen["alive"]) == 3, seen
        assert "could not replace" not in rep.stderr + seen["stderr"], (rep, seen)
        rep = nb.execute("print(sorted(nbdist.current().run('1+1', show=False).items()))")
        assert "[(1, '2'), (2, '2'), (3, '2')]" in rep.stdout, rep


def test_status_names_the_state_of_the_world(nb):
    rep = nb.execute("print(nbdist.current().status())")
    assert rep.status == "ok" and "world: running" in rep.stdout, rep


EXIT_SCRIPT = """
import sys, time
sys.path.insert(0, {bench!r})
import nbdist, _lifecycle
from nbdist.cluster.session import session
nbdist.start(3, heal=True, quiet=True)
print("template", session().template_pid(), flush=True)
_lifecycle.into_heal(3, {delay})
print("exiting", time.time(), flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.15])
def test_exit_during_a_heal_does_not_wait_it_out(delay, tmp_path):
    script = tmp_path / "exit_during_heal.py"
    script.write_text(EXIT_SCRIPT.format(bench=str(ROOT / "bench" / "lifecycle"), delay=delay))
    for _ in range(ROUNDS):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "NBDIST_PREWARM": "1"})
        ended = time.time()
        assert proc.returncode == 0, proc
        said = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
        took = ended - float(said["exiting"])
        assert "could not replace" not in proc.stderr, proc.stderr
        assert "timed out" not in proc.stderr, proc.stderr
        assert took < 10.0, (took, proc.stderr)  # was 60 s: the heal waited for dead ranks
        template = int(said["template"])
        assert not psutil.pid_exists(template) or \
            psutil.Process(template).status() == psutil.STATUS_ZOMBIE
        assert time.monotonic() - t0 < 110


#: Seeds that once failed (bench/lifecycle/lifecycle_stress.py), kept. Seeds 0 and 6 kill a rank
#: while rank 0 is inside a heal's init_rpc. Seed 0: the late agent that call left made the next
#: start fail with "RPC is already initialized" (fixed: ``session._drop_late_agent``). Both:
#: the call outlived the heal by a minute or more, inside Gloo's retried connects to the dead
#: peer, the agent's start reading each peer's address from the file store, or the last
#: all-gather (fixed: ``session._abandon_in_gloo``, ``ClosableStore``,
#: ``rpc_hooks.release_gathers``), and the restart after it failed (seed 6, in CI) or waited.
#: Seed 16: a Ctrl-C during a start left a forked worker whose pid was not yet known, running
#: after the start said it was gone (fixed: ``shield.held_interrupts``).
REGRESSION_SEEDS = [0, 6, 16]


def _stress(kernel, seeds, steps: int) -> list[dict]:
    rep = kernel.execute(SETUP.replace("%dist_start 3 --heal", ""), timeout=180)
    assert rep.status == "ok", rep
    out = []
    for seed in seeds:
        rep = kernel.execute(f"print(repr(_lifecycle.run_seed(get_ipython(), {seed}, {steps})))",
                             timeout=steps * 80 + 60)
        assert rep.status == "ok", rep
        import ast

        res = ast.literal_eval(rep.stdout.strip().splitlines()[-1])
        assert res["failure"] is None, res
        assert res["steps"] == steps, res
        out.append(res)
    return out


def test_a_short_seeded_stress_keeps_processes_and_status_in_agreement(kernel):
    """Random steps (start, stop, restart, --keep, grow, shrink, SIGKILL, Ctrl-C of a cell
    and of a start), each checked: the live workers are the ranks %dist_status lists,
    nbdist.current() agrees, no step waits past its deadline."""
    _stress(kernel, range(1, 11), 6)


@pytest.mark.slow
def test_ten_seeds_of_twenty_steps(kernel):
    _stress(kernel, range(1, 11), 20)


@pytest.mark.slow
@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_regression_seed(kernel, seed):
    (res,) = _stress(kernel, [seed], 20)
    assert res["long"] == 0, res  # no step waited for an earlier start's leftovers
