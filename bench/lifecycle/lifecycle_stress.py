"""Issue 45: a world's life cycle under stop, restart, heal, grow and Ctrl-C in any order.

Two parts, in one process acting as the notebook (an in-process IPython shell; Ctrl-C is a
SIGINT to it, as Jupyter's interrupt is): each of the issue's three cases (a stop, a restart,
the process's exit, right after a SIGKILL while ``--heal`` rebuilds the world) ``--rounds``
times, then ``--seeds`` seeded random sequences of ``--steps`` steps (start, stop, restart,
``--keep``, grow, shrink, SIGKILL, Ctrl-C of a cell and of a start), each step checked
(``bench/lifecycle/_lifecycle.py``). Writes ``bench/results/lifecycle_stress.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_FAMILY = Path(__file__).resolve().parent
sys.path[:0] = [str(_FAMILY), str(_FAMILY.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402
import _lifecycle  # noqa: E402

__all__ = ["main"]

EXIT_SCRIPT = """
import sys, time
sys.path.insert(0, {bench!r})
import nbdist, _lifecycle
nbdist.start(3, heal=True, quiet=True)
_lifecycle.into_heal(3, {delay})
print("exiting", time.time(), flush=True)
"""


def _case(ip, command: str, delay: float) -> tuple[bool, float, str, bool]:
    """Kill rank 3 of a 3-worker --heal world, ``command`` ``delay`` s into the heal:
    (passed, seconds the command took, what went wrong, whether it landed during the heal:
    one that landed after it meets a healed world, whose "healed" line is right)."""
    import contextlib
    import io

    err = io.StringIO()
    ip.run_line_magic("dist_start", "3 --heal")
    with contextlib.redirect_stderr(err):
        during = _lifecycle.into_heal(3, delay).state.value == "healing"
        t0 = time.monotonic()
        try:
            ip.run_line_magic(*command.split(" ", 1))
        except Exception as exc:  # noqa: BLE001 - the case failed; said in the results
            return False, time.monotonic() - t0, repr(exc), during
        took = time.monotonic() - t0
        time.sleep(1.0)  # a heal that went on would say "healed" by now
    seen = _lifecycle.check()
    want = "none" if command.startswith("dist_stop") else "running"
    ok = seen["ok"] and seen["state"] == want and "could not replace" not in err.getvalue() \
        and not (during and "healed" in err.getvalue())
    ip.run_line_magic("dist_stop", "")
    return ok, took, "" if ok else f"{seen} {err.getvalue()[-300:]}", during


def _exit_case(delay: float) -> tuple[bool, float, str]:
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT.format(
        bench=str(Path(__file__).resolve().parent), delay=delay)],
        capture_output=True, text=True, timeout=180)
    ended = time.time()
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("exiting ")]
    took = ended - float(said[0].split()[1]) if said else float("nan")
    ok = proc.returncode == 0 and bool(said) and took < 10.0 and \
        "could not replace" not in proc.stderr
    return ok, took, "" if ok else proc.stderr[-300:], True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    _common.add_arguments(ap)
    ap.add_argument("--rounds", type=int, default=20, help="runs of each of the three cases")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--steps", type=int, default=20, help="steps per seed")
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args()
    rounds, seeds, steps = (1, 1, 4) if args.smoke else (args.rounds, args.seeds, args.steps)
    first = 1 if args.smoke else args.first_seed
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    delays = [0.0, 0.03, 0.06, 0.09, 0.12, 0.15, 0.18]  # a heal takes 0.2 to 0.3 s here
    cases: dict[str, dict] = {}
    for name, run in (("stop", lambda d: _case(ip, "dist_stop ", d)),
                      ("restart", lambda d: _case(ip, "dist_restart 3", d)),
                      ("exit", _exit_case)):
        got = [run(delays[i % len(delays)]) for i in range(rounds)]
        cases[name] = {"passed": sum(ok for ok, *_ in got), "runs": rounds,
                       "during": sum(d for *_, d in got) if name != "exit" else None,
                       "max_s": round(max(t for _, t, *_ in got), 2),
                       "failures": [why for ok, _, why, _ in got if not ok][:3]}
    t0 = time.monotonic()
    runs = [_lifecycle.run_seed(ip, s, steps)
            for s in range(first, first + seeds)]
    total = time.monotonic() - t0
    passed = [r for r in runs if r["failure"] is None]
    out = _common.out_dir(args)
    commit = _common.measured_commit()
    (out / "lifecycle_stress.json").write_text(json.dumps({
        "commit": commit, "when": datetime.datetime.now(datetime.UTC).isoformat(),
        "cases": cases, "seeds": runs, "cores": os.cpu_count()}, indent=2) + "\n")
    lines = [f"# A life cycle nothing races (issue 45; commit {commit})", "",
             f"`python bench/lifecycle/lifecycle_stress.py --rounds {rounds} --seeds {seeds} "
             f"--steps {steps}` on {os.cpu_count()} cores.", "",
             "| case (right after a SIGKILL, during the heal) | passed | landed during the "
             "heal | slowest command s |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['passed']}/{v['runs']} | "
              f"{'-' if v['during'] is None else v['during']} | {v['max_s']} |"
              for k, v in cases.items()]
    lines += ["", f"Stress: {len(passed)}/{len(runs)} seeds passed, "
              f"{sum(r['steps'] for r in runs)} steps checked in {total:.0f} s; slowest step "
              f"{max((r['slowest'] for r in runs), default=0):.1f} s; steps over "
              f"{_lifecycle.LONG:g} s: {sum(r['long'] for r in runs)}.", ""]
    failed = [r for r in runs if r["failure"] is not None]
    if failed:
        lines += ["Failing seeds (keep them as regression tests in "
                  "tests/kernel/test_lifecycle.py):", ""]
        lines += [f"- seed {r['seed']}, step {r['failure']['step']} "
                  f"({r['failure']['kind']}): {r['failure'].get('why')} "
                  f"{r['failure']['outcome']}" for r in failed]
    (out / "lifecycle_stress.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = not failed and all(v["passed"] == v["runs"] for v in cases.values())
    return 0 if ok or not args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
