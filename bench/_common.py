"""What every bench script shares: ``--smoke``, ``--out`` and the commit a run measured.

``--smoke`` runs a script in seconds at tiny sizes, to prove it still works against today's
nbdist (``tests/benchmarks/test_bench_smoke.py`` runs every script so, as part of
``make test``); its figures mean nothing. A smoke run writes its results to a fresh temporary
directory unless ``--out`` names one, so it never touches ``bench/results``. Every results
file records the commit it measured (``git rev-parse --short HEAD``, ``-dirty`` when the
sources differ).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

__all__ = ["RESULTS", "add_arguments", "measured_commit", "out_dir", "png_metadata", "tree_cpu"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

#: What makes a tree "dirty" for a measurement: the sources, not the results being rewritten.
_SOURCES = ("nbdist", "bench", "pyproject.toml", "constraints.txt")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """Add ``--smoke`` and ``--out`` to a bench script's parser."""
    ap.add_argument("--smoke", action="store_true",
                    help="seconds, tiny sizes, results to a temporary directory: proves the "
                         "script runs, measures nothing")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory for the results (default: bench/results, or a temporary "
                         "directory with --smoke)")


def out_dir(args: argparse.Namespace) -> Path:
    """Where this run writes: ``--out``, else a temporary directory (smoke) or bench/results."""
    if args.out is not None:
        out = Path(args.out).resolve()
    elif getattr(args, "smoke", False):
        out = Path(tempfile.mkdtemp(prefix="nbdist-bench-smoke-"))
    else:
        out = RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out


def measured_commit() -> str:
    """The short commit of the tree being measured, ``-dirty`` if its sources differ from it."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                *_SOURCES], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    changed = [line[3:] for line in dirty.splitlines()
               if not line[3:].startswith("bench/results/")]
    return (head or "unknown") + ("-dirty" if changed else "")


def tree_cpu() -> float:
    """CPU seconds (user + system) used so far by this process and all its descendants,
    reaped ones included."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def png_metadata(commit: str) -> dict[str, str]:
    """``savefig(metadata=...)`` for a plot: the commit it shows, in the PNG's text chunk."""
    return {"Description": f"nbdist bench at {commit}"}
