"""Is this tree as fast as an earlier commit? Start-up, a ``%%dist`` round trip and an
``rpc_sync``, measured in fresh processes that take turns between the two trees.

``python bench/startup/against.py [REF] [--rounds 6]`` (part of ``make bench``, against
``HEAD``: what the uncommitted change costs) copies ``REF``'s ``nbdist/`` out of git into a
temporary directory, then runs ``rounds`` pairs of child processes, the order alternating
(ref, tree; tree, ref; ...) so that a busy spell of a shared machine hits both. Each child
imports nbdist from its tree (checked), starts a 2-rank world (``nbdist.start(2)``: import,
fork, join), runs a trivial cell on the workers many times (``Cluster.run``) and calls an
empty function on rank 1 many times (``rpc_sync``), then stops: each child's median cell and
call, then the medians of those per tree (a mean read a busy spell as a slower tree), and the
ratio tree/ref; a refactoring that keeps behaviour should keep each ratio near 1.

Writes ``bench/results/against.json`` and ``.md`` (both commits named).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

_FAMILY = Path(__file__).resolve().parent
sys.path[:0] = [str(_FAMILY), str(_FAMILY.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

__all__ = ["main", "render"]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import nbdist
c = nbdist.start(2, quiet=True)
start = time.perf_counter() - t0
import torch.distributed.rpc as rpc
def noop():
    return None
cells, calls = int(sys.argv[1]), int(sys.argv[2])
for _ in range(10):
    c.run("x = 1", show=False)
    rpc.rpc_sync("worker1", noop)
def each(n, step):  # the median of n timed steps: a busy spell of 2 shared cores skews a mean
    took = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        took.append(time.perf_counter() - t)
    return sorted(took)[n // 2]
cell = each(cells, lambda: c.run("x = 1", show=False))
call = each(calls, lambda: rpc.rpc_sync("worker1", noop))
nbdist.stop()
print("RESULT " + json.dumps({"start_s": start, "cell_s": cell, "rpc_s": call,
                              "nbdist": nbdist.__file__}), flush=True)
"""
MEASURES = (("start_s", "start: import nbdist + `nbdist.start(2)`", 1e3, "ms"),
            ("cell_s", "a trivial cell on both workers (`Cluster.run`)", 1e6, "us"),
            ("rpc_s", "`rpc_sync` of an empty function to rank 1", 1e6, "us"))


def _commit(ref: str) -> str:
    out = subprocess.run(["git", "-C", str(_common.ROOT), "rev-parse", "--short", ref],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"against.py: {ref!r} is not a commit of this repository: "
                         f"{out.stderr.strip()}")
    return out.stdout.strip()


def _export(ref: str, dest: Path) -> None:
    """``ref``'s ``nbdist/`` into ``dest`` (``git archive``: no worktree is registered)."""
    archive = dest / "ref.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(_common.ROOT), "archive", ref, "nbdist"], stdout=f,
                       check=True, timeout=120)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    archive.unlink()


def _one(tree: Path, cells: int, calls: int, cwd: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", CHILD, str(cells), str(calls)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    found = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not found:
        raise RuntimeError(f"the child on {tree} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    res = json.loads(found[0][len("RESULT "):])
    if not Path(res["nbdist"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the child for {tree} imported nbdist from {res['nbdist']}")
    return res


def render(res: dict) -> str:
    """The results as Markdown."""
    lines = ["# This tree against an earlier commit (bench/startup/against.py)\n",
             f"nbdist bench at {res['commit']} against {res['ref']} ({res['ref_commit']}); "
             f"{res['rounds']} rounds, each tree once per round, the order alternating; "
             f"{res['cells']} cells and {res['calls']} calls per child, each timed; the median "
             "of each child's medians. Rerun: "
             f"`python bench/startup/against.py {res['ref']} --rounds {res['rounds']}`.\n",
             "| measure | ref | this tree | this tree / ref |", "|---|---|---|---|"]
    for key, what, scale, unit in MEASURES:
        ref, tree = res["ref_median"][key], res["tree_median"][key]
        lines.append(f"| {what} | {ref * scale:,.1f} {unit} | {tree * scale:,.1f} {unit} | "
                     f"{tree / ref:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", nargs="?", default="HEAD", help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=6)
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    rounds, cells, calls = (1, 5, 20) if args.smoke else (args.rounds, 500, 2000)
    out = _common.out_dir(args)
    ref_commit = _commit(args.ref)
    got: dict[str, list[dict]] = {"ref": [], "tree": []}
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-against-") as tmp:
        ref_tree = Path(tmp) / "ref"
        ref_tree.mkdir()
        _export(args.ref, ref_tree)
        trees = {"ref": ref_tree, "tree": _common.ROOT}
        for i in range(rounds):
            for side in (("ref", "tree") if i % 2 == 0 else ("tree", "ref")):
                got[side].append(_one(trees[side], cells, calls, tmp))
                print(f"round {i + 1}/{rounds} {side}: "
                      + ", ".join(f"{k} {got[side][-1][k]:.6f}" for k, *_ in MEASURES),
                      flush=True)
    res = {"commit": _common.measured_commit(), "ref": args.ref, "ref_commit": ref_commit,
           "rounds": rounds, "cells": cells, "calls": calls,
           "ref_median": {k: statistics.median(r[k] for r in got["ref"]) for k, *_ in MEASURES},
           "tree_median": {k: statistics.median(r[k] for r in got["tree"])
                           for k, *_ in MEASURES},
           "runs": {side: [{k: r[k] for k, *_ in MEASURES} for r in rs]
                    for side, rs in got.items()}}
    (out / "against.json").write_text(json.dumps(res, indent=1))
    text = render(res)
    (out / "against.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
