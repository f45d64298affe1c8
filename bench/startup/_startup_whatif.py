"""Bench-only what-if: how fast would nbdist start with the fixes ``bench/startup/startup.py``
suggests?

``python bench/startup/_startup_whatif.py [--n 4] [--rounds 3] [--restarts 3]`` runs, for each
variant in turn (the order rotates per round, so a busy spell of a shared machine hits all of
them), a fresh "notebook" process that has imported torch, times ``nbdist.start(n)`` (cold) and then
``c.restart(n)`` a few times. Nothing in ``nbdist`` is edited: each variant is applied from the
outside, by starting the template through this file and by replacing one function:

- ``as-is``: nbdist as it is (since 88ee4d7 nobody imports ``torch.distributed.optim`` at
  start-up; an import hook silences its warning if a user imports it).
- ``optim-in-workers``: as before d3256c8: rank 0 and every forked worker import
  ``torch.distributed.optim`` (~1.5 CPU s each) in ``quiet.hide_warnings``.
- ``optim-in-template``: as between d3256c8 and 88ee4d7: the template imports it once before
  forking (workers inherit it), rank 0 imports it too.
- ``gc-freeze``: as-is, and the template calls ``gc.collect(); gc.freeze()`` before forking, so
  a worker's garbage collections do not touch (copy-on-write) the template's objects.

Prints a table of medians (seconds and CPU seconds) and writes ``bench/results/
startup_whatif.json`` (naming the commit measured). Cleans up like ``startup.py``; exits
non-zero on any error. ``--smoke``: ``optim-in-template`` once (both shims), one worker, a
temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("as-is", "optim-in-workers", "optim-in-template", "gc-freeze")
ENV = "NBDIST_BENCH_WHATIF"


def _eager_quiet_warnings() -> None:
    """``quiet.hide_warnings`` as it was before 88ee4d7: imports torch.distributed.optim."""
    import warnings

    from nbdist.patches import quiet

    for pattern in quiet.WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.distributed.optim  # noqa: F401
    name = "_scripted_functional_optimizer_deprecation_warning"
    for modname, mod in list(sys.modules.items()):
        if modname.startswith("torch.distributed.optim") and hasattr(mod, name):
            setattr(mod, name, lambda stacklevel=0: None)


def _apply_notebook(variant: str) -> None:
    import subprocess as _sp

    from nbdist.hosts import launch
    from nbdist.patches import quiet

    os.environ[ENV] = variant
    if variant.startswith("optim-"):
        quiet.hide_warnings = _eager_quiet_warnings
    if variant == "as-is":
        return
    real = _sp.Popen

    class _Shim:
        def __getattr__(self, attr: str) -> object:
            return getattr(_sp, attr)

        def Popen(self, args: list, **kw: object) -> _sp.Popen:  # noqa: N802
            if list(args[1:3]) == ["-m", "nbdist.proc.template"]:
                args = [args[0], str(Path(__file__).resolve()), "--template", *args[3:]]
            return real(args, **kw)

    launch.subprocess = _Shim()  # only nbdist.launch sees the shim


def _template(fd: int, runtime_dir: str) -> None:
    import gc

    from nbdist.patches import quiet
    from nbdist.proc import template

    variant = os.environ.get(ENV, "as-is")
    preload = template.preload

    def _preload() -> None:
        preload()
        if variant == "optim-in-template":
            _eager_quiet_warnings()  # imported once here; forked workers inherit it
        elif variant == "optim-in-workers":
            quiet.hide_warnings = _eager_quiet_warnings  # each worker imports it
        elif variant == "gc-freeze":
            gc.collect()
            gc.freeze()

    template.preload = _preload
    template.main(fd, runtime_dir)


def _measure(variant: str, n: int, restarts: int) -> dict:
    import torch  # noqa: F401  (the notebook's first cell, untimed)

    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import _startup_phases as phases
    from startup import _tree_cpu

    import nbdist

    _apply_notebook(variant)
    phases.install()
    cpu0, t0 = _tree_cpu(), time.perf_counter()
    c = nbdist.start(n, quiet=True)
    if "nbdist-bench-whatif" not in nbdist.__file__:
        raise RuntimeError(f"nbdist imported from {nbdist.__file__}, not from the snapshot")
    out = {"variant": variant, "cold": time.perf_counter() - t0, "cold_cpu": _tree_cpu() - cpu0,
           "cold_phases": phases.breakdown(t0), "restart": [], "restart_cpu": [],
           "restart_phases": []}
    try:
        for _ in range(restarts):
            cpu0, t0 = _tree_cpu(), time.perf_counter()
            c = c.restart(n, quiet=True)
            out["restart"].append(time.perf_counter() - t0)
            out["restart_cpu"].append(_tree_cpu() - cpu0)
            out["restart_phases"].append(phases.breakdown(t0))
    finally:
        c.stop()
        from nbdist.cluster.session import session
        _cl = session()

        if _cl.template is not None:
            _cl.template.close()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--template"]:
        _template(int(argv[1]), argv[2])
        return 0
    if argv[:1] == ["--measure"]:
        print("RESULT " + json.dumps(_measure(argv[1], int(argv[2]), int(argv[3]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--timeout", type=float, default=600.0)
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    import _common

    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.smoke:  # both shims (the template's, rank 0's warnings) once, one worker
        args.n, args.rounds, args.restarts = 1, 1, 1
        args.variants = ["optim-in-template"]
    out_dir = _common.out_dir(args)

    import shutil
    import tempfile

    from startup import _become_subreaper, _descendants, _kill, _nbdist_version, _snapshot, _sweep

    _become_subreaper()
    version = _nbdist_version()
    commit = _common.measured_commit()
    cwd, tmp = os.getcwd(), Path(tempfile.mkdtemp(prefix="nbdist-bench-whatif-"))
    _snapshot(tmp / "src")  # one version of nbdist for every variant, however long this takes
    os.environ.setdefault("NBDIST_TEMPLATE_IDLE", "600")
    rows: dict[str, list[dict]] = {v: [] for v in args.variants}
    leftovers: dict[str, int] = {}
    load0 = os.getloadavg()[0]
    status = 0
    try:
        for rnd in range(args.rounds):
            k = rnd % len(args.variants)
            for v in args.variants[k:] + args.variants[:k]:
                proc = subprocess.run(
                    [sys.executable, str(HERE / "_startup_whatif.py"), "--measure", v, str(args.n),
                     str(args.restarts)],
                    capture_output=True, text=True, timeout=args.timeout)
                _sweep(v, leftovers)
                res = next((json.loads(line[7:]) for line in proc.stdout.splitlines()
                            if line.startswith("RESULT ")), None)
                if proc.returncode != 0 or res is None:
                    raise RuntimeError(f"{v}: exited {proc.returncode}\n{proc.stderr[-3000:]}")
                rows[v].append(res)
                print(f"round {rnd + 1} {v:18} cold {res['cold']:6.2f}s  restarts "
                      + " ".join(f"{x:.2f}" for x in res["restart"])
                      + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    except BaseException as exc:  # noqa: BLE001
        print(f"what-if failed: {exc}", file=sys.stderr)
        status = 1
    finally:
        left = _descendants()
        if left:
            _kill(left)
            status = 1
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    print(f"\nN={args.n}, load {load0:.1f} -> {os.getloadavg()[0]:.1f}; medians:")
    print(f"{'variant':18} {'cold s':>7} {'cold CPU':>8} {'restart s':>9} {'restart CPU':>11}")
    for v, rs in rows.items():
        if not rs:
            continue
        s = {"cold": statistics.median(r["cold"] for r in rs),
             "cold_cpu": statistics.median(r["cold_cpu"] for r in rs),
             "restart": statistics.median(x for r in rs for x in r["restart"]),
             "restart_cpu": statistics.median(x for r in rs for x in r["restart_cpu"])}
        summary[v] = s
        print(f"{v:18} {s['cold']:7.2f} {s['cold_cpu']:8.2f} {s['restart']:9.2f} "
              f"{s['restart_cpu']:11.2f}")
    out = out_dir / "startup_whatif.json"
    out.write_text(json.dumps({"commit": commit, "n": args.n, "nbdist": version,
                               "smoke": args.smoke, "load_start": load0,
                               "load_end": os.getloadavg()[0], "summary": summary, "runs": rows,
                               "leftovers": leftovers}, indent=1) + "\n")
    print(f"wrote {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
