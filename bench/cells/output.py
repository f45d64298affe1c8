"""What merging equal lines of many ranks (``aggregate``) costs and gives, with it off and on.

``python bench/cells/output.py`` (part of ``make bench``). In one world of 8 workers:

1. **Delay of a line nothing merges with**: outside any cell, 3 ranks each print a line
   stamped with the time every 0.2 s (RPCs running on them); from print to the router's
   write, off and on taking turns.
2. **A line every rank prints**: a cell in which all 8 ranks print the same line at one
   agreed moment; how many lines are shown and when the last is, after that moment.
3. **A flood**: a cell in which every rank prints 20,000 lines of its own as fast as it can;
   seconds from the cell's start until every line was written.

Lines are not shown (the router's write is recorded instead). Writes
``bench/results/output.json`` and ``bench/results/output.md`` (naming the commit measured).
``--smoke``: 3 workers, tiny counts, a temporary directory. Every process it starts is
stopped at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed.rpc as rpc

import nbdist
from nbdist.output.router import Router

_FAMILY = Path(__file__).resolve().parent
sys.path[:0] = [str(_FAMILY), str(_FAMILY.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

__all__ = ["bench_delay", "bench_flood", "bench_together", "main"]

_STAMP = re.compile(r"stamped \d+ \d+ ([0-9.]+)$")


class Writes:
    """Records the router's writes, with when they happened, instead of showing them."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float, str]] = []  # (monotonic, wall, text)
        self._lock = threading.Lock()
        self._real = Router.write

    def __enter__(self) -> Writes:
        def record(stream: str, text: str) -> None:
            with self._lock:
                self.seen.append((time.monotonic(), time.time(), text))

        Router.write = staticmethod(record)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Router.write = self._real  # type: ignore[method-assign]

    def clear(self) -> None:
        with self._lock:
            self.seen.clear()

    def lines(self) -> list[tuple[float, float, str]]:
        with self._lock:
            return [(m, w, line) for m, w, text in self.seen for line in text.splitlines()]


def stamp(rank: int, n: int) -> None:
    """Runs on a worker: ``n`` lines stamped with this machine's monotonic clock."""
    for k in range(n):
        print(f"stamped {rank} {k} {time.monotonic()}")
        time.sleep(0.2)


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(int(len(xs) * p), len(xs) - 1)]


def bench_delay(c: nbdist.Cluster, w: Writes, lines: int, reps: int) -> dict:
    """Print-to-write delay of lines that nothing merges with, aggregate off and on."""
    delays: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(reps):
        for on in ((False, True) if rep % 2 == 0 else (True, False)):
            c.router.aggregate = on
            w.clear()
            futs = [rpc.rpc_async(c.names[r], stamp, args=(r, lines)) for r in (1, 2, 3)]
            for f in futs:
                f.wait()
            c.flush()
            for at, _, line in w.lines():
                m = _STAMP.search(line)
                if m:
                    delays[on].append((at - float(m.group(1))) * 1e3)
    c.router.aggregate = True
    return {str(on).lower(): {"lines": len(d), "p50_ms": round(statistics.median(d), 1),
                              "p90_ms": round(_pct(d, 0.9), 1)} for on, d in delays.items()}


def bench_together(c: nbdist.Cluster, w: Writes, reps: int) -> dict:
    """Every rank prints the same line at one moment: lines shown, and the last one's delay."""
    out: dict[bool, dict[str, list[float]]] = {on: {"shown": [], "last_ms": []}
                                               for on in (False, True)}
    for rep in range(reps):
        for on in ((False, True) if rep % 2 == 0 else (True, False)):
            w.clear()
            at = time.time() + 0.5
            c.run(f"import time\ntime.sleep(max(0, {at} - time.time()))\n"
                  "print('epoch 3 done')\n", show=False, aggregate=on)
            shown = [wall for _, wall, line in w.lines() if line.endswith("] epoch 3 done")]
            out[on]["shown"].append(len(shown))
            out[on]["last_ms"].append((max(shown) - at) * 1e3)
    return {str(on).lower(): {"lines_shown": max(d["shown"]),
                              "last_shown_ms_p50": round(statistics.median(d["last_ms"]), 1)}
            for on, d in out.items()}


def bench_flood(c: nbdist.Cluster, w: Writes, lines: int) -> dict:
    """Every rank prints ``lines`` lines of its own at once: seconds until all were written."""
    out = {}
    for on in (False, True, False, True):
        w.clear()
        t0 = time.perf_counter()
        c.run(f"import os\nr = os.environ['NBDIST_RANK']\nfor i in range({lines}):\n"
              "    print('step', i, 'of rank', r)\n", show=False, aggregate=on)
        c.flush()
        took = time.perf_counter() - t0
        out.setdefault(str(on).lower(), []).append(round(took, 2))
    return {k: {"seconds": v, "lines": lines * (c.world_size - 1)} for k, v in out.items()}


def _markdown(r: dict) -> str:
    d, t, f = r["delay"], r["together"], r["flood"]
    m = r["meta"]
    return "\n".join([
        "# Merged output of many ranks (bench/cells/output.py)", "",
        f"{m['when']} · {m['cores']} cores · load average (1m) {m['load_start']} at start, "
        f"{m['load_end']} at end · torch {m['torch']} · Python {m['python']} · nbdist at "
        f"{m['commit']} · {m['workers']} workers", "",
        "| | aggregate off | aggregate on |", "|---|---|---|",
        f"| a line nothing merges with: print → shown, p50 / p90 | {d['false']['p50_ms']} / "
        f"{d['false']['p90_ms']} ms | {d['true']['p50_ms']} / {d['true']['p90_ms']} ms |",
        f"| one line printed by every rank at one moment: lines shown | "
        f"{t['false']['lines_shown']} | {t['true']['lines_shown']} |",
        f"| ... the last shown after that moment (p50) | {t['false']['last_shown_ms_p50']} ms "
        f"| {t['true']['last_shown_ms_p50']} ms |",
        f"| a flood of {f['false']['lines']:,} lines (all ranks): seconds to show, per run | "
        f"{', '.join(map(str, f['false']['seconds']))} | "
        f"{', '.join(map(str, f['true']['seconds']))} |", "",
        "A line waits at most the merge window (0.1 s) for the same line from other ranks, and "
        "goes as soon as every rank of the cell printed it; a rank printing more than 1,000 "
        "lines a second is shown as printed.", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    smoke = args.smoke
    out = _common.out_dir(args)
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cores": os.cpu_count(), "load_start": round(os.getloadavg()[0], 1),
            "torch": torch.__version__, "python": platform.python_version(),
            "commit": _common.measured_commit(), "smoke": smoke}
    workers = 3 if smoke else 8
    with Writes() as w:
        c = nbdist.start(workers, quiet=True, aggregate=True)
        try:
            c.run("print('up')", show=False)
            c.flush()
            results = {"delay": bench_delay(c, w, 3 if smoke else 10, 1 if smoke else 4),
                       "together": bench_together(c, w, 1 if smoke else 5),
                       "flood": bench_flood(c, w, 200 if smoke else 20_000)}
        finally:
            c.stop()
    meta.update(load_end=round(os.getloadavg()[0], 1), workers=workers)
    results["meta"] = meta
    (out / "output.json").write_text(json.dumps(results, indent=1) + "\n")
    md = _markdown(results)
    (out / "output.md").write_text(md)
    print(md)
    print(f"results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
