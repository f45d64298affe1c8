"""Big worlds start every time: nbdist's start of N ranks repeated, beside plain torch's.

``python bench/scale/starts.py`` (part of ``make bench``): for N = 64, 128 and 256 ranks on this
machine, and with root fake hosts (``--host-shapes``: 8 x 16 and 8 x 32 ranks, a 256-rank world
across hosts; ``--no-hosts``: none), ``--repeat`` (10) fresh
processes each start a world of N ranks (``_scale_child.py once``: start, a cell on every
rank, a view call, stop), and plain torch's ``init_rpc`` with its own transports (what a
script gets) is tried ``--plain`` (3) times at each N on this machine. Each attempt's
outcome is counted, none hidden: how many of the tries worked, the start's seconds (min,
median, max) and the first error of each kind. Writes ``bench/results/scale_starts.json`` and
``scale_starts.md``; with ``--sizes``, the rows not measured again (other sizes, or plain torch
with ``--plain 0``) already there stay, each naming the commit and day it was measured at.
``--smoke``: N = 4, 2 starts, 1 plain try, results to a temporary directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import _common  # noqa: E402
from _scale_child import count_names  # noqa: E402
from scale import HOSTS, _child, can_make_namespaces  # noqa: E402

__all__ = ["main"]

SIZES = (64, 128, 256)
SHAPES = f"{HOSTS[0]}x{HOSTS[1]},{HOSTS[0]}x{2 * HOSTS[1]}"  # 128 and 256 ranks across hosts


def _shapes(ap: argparse.ArgumentParser, text: str) -> list[tuple[int, int]]:
    """``"8x16,8x32"`` as [(8, 16), (8, 32)]; a malformed one is refused in the flag's terms."""
    shapes = []
    for part in filter(None, text.split(",")):
        hosts, _, per = part.strip().partition("x")
        if not (hosts.isdigit() and per.isdigit() and int(hosts) > 0 and int(per) > 0):
            ap.error(f"--host-shapes: {part!r} is not HOSTSxRANKS, such as 8x16")
        shapes.append((int(hosts), int(per)))
    return shapes


def _error_kind(error: str) -> str:
    """An error with its lists of names counted, so that alike failures count together."""
    return re.sub(r"\[[^\]]*$", "[names...]", count_names(error))[:200]  # a list cut short


def _tally(rows: list[dict]) -> dict:
    """How many of ``rows`` worked, their start seconds' spread and the errors met."""
    ok = [r["start_s"] for r in rows if "error" not in r and "start_s" in r]
    errors: dict[str, int] = {}
    for r in rows:
        if "error" in r:
            kind = _error_kind(r["error"])
            errors[kind] = errors.get(kind, 0) + 1
    spread = {"min": min(ok), "median": round(statistics.median(ok), 2), "max": max(ok)} \
        if ok else {}
    return {"tries": len(rows), "worked": len(ok), "start_s": spread, "errors": errors}


def _kept(path: Path, table: list[dict]) -> list[dict]:
    """The rows of ``path``'s table not measured again in ``table`` (each names its commit)."""
    if not path.exists():
        return []
    old, now = json.loads(path.read_text()), {(t["who"], t["n"]) for t in table}
    return [{"commit": old["commit"], "day": old.get("day", ""), **t}
            for t in old["table"] if (t["who"], t["n"]) not in now]


def _markdown(table: list[dict], commit: str) -> str:
    commits = sorted({t.get("commit", commit) for t in table})
    where = ("at " + commit) if commits == [commit] else \
        "at " + ", ".join(commits) + " (the row names its own)"
    lines = [f"# Big worlds start every time (bench/scale/starts.py), nbdist {where}", "",
             f"{datetime.date.today()}, {os.cpu_count()} cores. Each try a fresh process: "
             "nbdist starts N ranks, runs a cell on every rank and a view call, stops; plain "
             "torch forks N - 1 processes after `import torch` and every one calls `init_rpc` "
             "(its own transports, `file://` rendezvous). Start seconds: to every rank "
             "answering (nbdist cold: its template imports torch).", "",
             "| who | N | worked / tries | start s (min, median, max) | errors (count) |"
             + (" measured at |" if len(commits) > 1 else ""),
             "|---|---|---|---|---|" + ("---|" if len(commits) > 1 else "")]
    for t in sorted(table, key=lambda t: (t["n"], t["who"] != "nbdist")):
        s = t["start_s"]
        spread = f"{s['min']:.1f}, {s['median']:.1f}, {s['max']:.1f}" if s else ""
        errors = "; ".join(f"{e} ({k})" for e, k in t["errors"].items()).replace("|", "/")
        at = f" {t.get('commit', commit)} {t.get('day', '')} |".replace("  ", " ") \
            if len(commits) > 1 else ""
        lines.append(f"| {t['who']} | {t['n']} | {t['worked']} / {t['tries']} | {spread} | "
                     f"{errors} |{at}")
    lines += ["", "On 2 cores a big world is oversubscribed (N processes on 2 CPUs): the "
              "counts say whether it starts, the seconds what such a machine takes; the "
              "16-core machine's figures are added when one is lent."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_arguments(ap)
    ap.add_argument("--sizes", default=None,
                    help="comma list of N (default 64,128,256; none: the hosts only)")
    ap.add_argument("--repeat", type=int, default=10, help="nbdist starts at each N")
    ap.add_argument("--plain", type=int, default=3, help="plain torch tries at each N")
    ap.add_argument("--hosts", action=argparse.BooleanOptionalAction, default=True,
                    help="also start worlds on fake hosts (root: network namespaces)")
    ap.add_argument("--host-shapes", default=SHAPES,
                    help=f"comma list of HOSTSxRANKS for --hosts (default {SHAPES})")
    args = ap.parse_args(argv)
    shapes = _shapes(ap, args.host_shapes)
    out = _common.out_dir(args)
    sizes = (4,) if args.smoke else SIZES
    if args.sizes:
        sizes = () if args.sizes == "none" else tuple(int(s) for s in args.sizes.split(","))
    repeat, plain = (2, 1) if args.smoke else (args.repeat, args.plain)
    import torch

    runs = [(n, [("nbdist", ("once", n), repeat),
                 ("plain torch (default)", ("plain", n, "default"), plain)]) for n in sizes]
    if args.hosts and not args.smoke and can_make_namespaces() is None:
        for hosts, per in shapes:
            runs.append((hosts * per + 1, [(f"nbdist, {hosts} hosts x {per}",
                                            ("once", hosts * per + 1, hosts, per), repeat)]))
    table = []
    for n, contenders in runs:
        for who, argv_, tries in contenders:
            if not tries:  # not measured now: with --sizes, the row already there stays
                continue
            rows = []
            for i in range(tries):
                rows.append(_child(*argv_))
                print(f"{who} N={n} try {i + 1}/{tries}: {json.dumps(rows[-1])}", flush=True)
            table.append({"who": who, "n": n, **_tally(rows), "rows": rows})
    commit, day = _common.measured_commit(), str(datetime.date.today())
    for t in table:
        t.update(commit=commit, day=day)
    if args.sizes and not args.smoke:
        table = _kept(out / "scale_starts.json", table) + table
    (out / "scale_starts.json").write_text(json.dumps(
        {"commit": commit, "day": day, "cores": os.cpu_count(), "torch": torch.__version__,
         "table": table}, indent=1) + "\n")
    (out / "scale_starts.md").write_text(_markdown(table, commit))
    print((out / "scale_starts.md").read_text())
    return 0 if all(t["worked"] == t["tries"] for t in table
                    if t["who"].startswith("nbdist") and t["commit"] == commit) else 1


if __name__ == "__main__":
    sys.exit(main())
