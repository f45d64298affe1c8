"""Big worlds: what a world of N ranks costs to start, run and stop, beside plain torch.

``python bench/scale/scale.py`` (part of ``make bench``): for N = 8, 32, 64, 128, 256 ranks on
this machine, each in a fresh process (``_scale_child.py``), taking turns:

- **plain torch**, no nbdist: N processes forked after ``import torch`` call ``init_rpc``
  (``file://`` rendezvous), once with torch's own transports (what a script gets: it fails
  from 64 ranks here, counted, not hidden) and once with TCP only (``_transports=["uv"]``,
  the choice nbdist makes above 16 ranks);
- **nbdist**: ``nbdist.start(N - 1)`` cold (its template imports torch), a restart, a trivial
  cell (``Cluster.run``, what ``%%dist`` calls), a view call (``c[:].call(os.getpid)``), a
  print on every rank (and how many lines the cell shows), ``%dist_status`` rendered, stop;
  with the control frames and bytes the notebook sent for each, rank 0's RSS growth per peer
  and the workers' PSS;
- with root (network namespaces), **8 fake hosts x 16 ranks** (``tests/fakehosts.py``).

Writes ``bench/results/scale.json``, ``scale.md`` and ``scale.png`` (time and memory against
N), naming the commit measured. On 2 cores a big world is oversubscribed (256 processes on
2 CPUs): its times say what this machine does, the frames and memory what nbdist does; the
table says how many cores measured it. ``--smoke``: N = 4, one plain run, 2 hosts x 1 rank,
results to a temporary directory (a big world's path is tests/world/test_big_worlds.py's).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1] / "tests")]
import _common  # noqa: E402
from fakehosts import can_make_namespaces  # noqa: E402

__all__ = ["main"]

SIZES = (8, 32, 64, 128, 256)
HOSTS = (8, 16)
CHILD_TIMEOUT = 900


def _child(*args: Any) -> dict[str, Any]:
    """One measurement in a fresh process; a crash or timeout is a result too."""
    argv = [sys.executable, str(HERE / "_scale_child.py"), *map(str, args)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"n": int(args[1]), "error": f"no result in {CHILD_TIMEOUT} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    lines = (done.stderr or done.stdout).strip().splitlines()
    return {"n": int(args[1]), "error": f"exit {done.returncode}: {' | '.join(lines[-3:])[:300]}",
            "traceback": lines[-40:]}  # where it failed: the json keeps it, the table not


def _fmt(row: dict, key: str, scale: float = 1.0, digits: int = 2) -> str:
    value = row.get(key)
    return "" if value is None else f"{value * scale:.{digits}f}"


def _cpu(row: dict, key: str) -> str:
    cpu = row.get(f"{key}_cpu_ms")
    return "" if cpu is None else f" ({cpu:.1f})"


def _sent(row: dict, key: str) -> str:
    sent = row.get(f"{key}_sent")
    return "" if not sent else f"{sent['frames']} / {sent['bytes'] / 1024:.0f} KB"


def _markdown(rows: list[dict], commit: str) -> str:
    lines = [
        f"# Big worlds (bench/scale/scale.py), nbdist at {commit}",
        "",
        f"{datetime.date.today()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        f", torch {rows[0].get('torch', '?') if rows else '?'}. Each row a fresh process. "
        "Start: to every rank answering an RPC (nbdist: cold, its template importing torch). "
        "Frames / bytes: what the notebook's control channels wrote for that step (a view call "
        "travels as one torch RPC per rank, not over them). A worker's PSS counts its share of "
        "the pages all ranks share (torch's code: the fewer ranks, the larger the share); its "
        "private MB is what one more rank costs.",
        "",
        "| who | N | start s | restart s | cell ms (notebook CPU) | view ms (CPU) | "
        "print ms (lines shown) | "
        "status ms | stop ms | cell frames / bytes | view frames / bytes | rank 0 MB per peer"
        " | worker PSS MB (median, max) | worker private MB | failure |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pss = r.get("worker_pss_mb") or {}
        uss = r.get("worker_uss_mb") or {}
        pss_text = f"{pss['median']}, {pss['max']}" if pss else ""
        uss_text = f"{uss['median']}" if uss else ""
        shown = f" ({r['print_lines_shown']})" if "print_lines_shown" in r else ""
        lines.append(
            f"| {r.get('who', '?')} | {r['n']} | {_fmt(r, 'start_s')} | {_fmt(r, 'restart_s')}"
            f" | {_fmt(r, 'cell_ms', digits=1)}{_cpu(r, 'cell')} | "
            f"{_fmt(r, 'view_ms', digits=1)}{_cpu(r, 'view')} | "
            f"{_fmt(r, 'print_ms', digits=1)}{shown} | {_fmt(r, 'status_ms', digits=1)} | "
            f"{_fmt(r, 'stop_ms', digits=0)} | {_sent(r, 'cell')} | {_sent(r, 'view')} | "
            f"{_fmt(r, 'rank0_mb_per_peer')} | "
            f"{pss_text} | {uss_text} | "
            f"{r.get('error', '')[:160]} |")
    lines += ["", "On 2 cores the times of big worlds measure an oversubscribed machine (N "
              "processes on 2 CPUs); the 16-core machine's figures are added when one is lent."]
    return "\n".join(lines) + "\n"


def _plot(rows: list[dict], path: Path, commit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, who in enumerate(dict.fromkeys(r["who"] for r in rows if "hosts" not in r["who"])):
        color = f"C{i}"  # one colour per contender in both panels
        mine = [r for r in rows if r["who"] == who]
        ok = [r for r in mine if "start_s" in r]
        left.plot([r["n"] for r in ok], [r["start_s"] for r in ok], "o-", color=color,
                  label=who)
        bad = [r for r in mine if "start_s" not in r]
        if bad:
            left.plot([r["n"] for r in bad], [1.0] * len(bad), "rx", markersize=10,
                      label=f"{who}: failed")
        mem = [r for r in ok if "rank0_mb_per_peer" in r]
        right.plot([r["n"] for r in mem], [r["rank0_mb_per_peer"] for r in mem], "o-",
                   color=color, label=f"{who}: rank 0 per peer")
        pss = [r for r in ok if r.get("worker_pss_mb")]
        right.plot([r["n"] for r in pss], [r["worker_pss_mb"]["median"] for r in pss], "s--",
                   color=color, label=f"{who}: worker PSS")
    for ax, title, unit in ((left, "time to ready", "s"), (right, "memory", "MB")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (N)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"nbdist {commit}, {os.cpu_count()} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, metadata=_common.png_metadata(commit))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_arguments(ap)
    ap.add_argument("--sizes", default=None, help="comma list of N (default 8,32,64,128,256)")
    args = ap.parse_args(argv)
    out = _common.out_dir(args)
    sizes = (4,) if args.smoke else SIZES  # light: it runs beside the Ray and SLURM beds
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    hosts = (2, 1) if args.smoke else HOSTS
    import torch

    rows: list[dict] = []
    for n in sizes:
        contenders = [("nbdist", n), ("plain", n, "default"), ("plain", n, "uv")]
        if args.smoke:
            contenders = contenders[:2]
        for c in contenders:
            row = _child(*c)
            row["torch"] = torch.__version__
            print(json.dumps(row), flush=True)
            rows.append(row)
    why = can_make_namespaces()
    if why is None:
        h, per = hosts
        row = _child("nbdist", h * per + 1, h, per)
        row["torch"] = torch.__version__
        print(json.dumps(row), flush=True)
        rows.append(row)
    else:
        print(f"no fake hosts: {why}")
    commit = _common.measured_commit()
    (out / "scale.json").write_text(json.dumps(
        {"commit": commit, "cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    (out / "scale.md").write_text(_markdown(rows, commit))
    _plot(rows, out / "scale.png", commit)
    print((out / "scale.md").read_text())
    failed_nbdist = [r for r in rows if r.get("who", "").startswith("nbdist") and "error" in r]
    return 1 if failed_nbdist else 0


if __name__ == "__main__":
    sys.exit(main())
