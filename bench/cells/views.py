"""One call to many ranks: ``c[...].call`` vs a loop of ``rpc_sync`` vs ipyparallel (issue 36).

``python bench/cells/views.py`` (part of ``make bench``). A trivial function defined here in
``__main__`` (so it travels by value, as a notebook cell's does) runs on 1, 4 and 8 workers:

- **view**: ``c[1:n+1].call(fn)``, nbdist's view (one ``rpc_async`` per rank, then one wait);
- **rpc_sync loop**: ``rpc_sync`` to each of the n ranks in turn, what a user writes without
  views; with n = 1 it is the issue's yardstick, one ``rpc_sync`` to one rank;
- **rpc_async, wait all**: plain torch's pipelined calls, the same messages as the view with
  no bookkeeping: the floor a view can reach over TensorPipe;
- **ipyparallel**: ``rc[:n].apply_sync(fn)`` on n engines of one local cluster.

Each round measures every contender at every n, one after another (interleaved), ``CALLS``
calls each; reported: the median over rounds of each round's median, and the best round.
Writes ``bench/results/views.json`` and ``views.md``; ``--smoke``: 2 workers, a few calls, no
ipyparallel, results to a temporary directory. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

import nbdist  # noqa: E402

__all__ = ["main", "trivial"]

CONTENDERS = ("view", "rpc_sync loop", "rpc_async, wait all", "ipyparallel apply_sync")


def trivial() -> int:
    return 1


def _median_us(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _contenders(c: nbdist.Cluster, rc: Any, n: int) -> dict[str, Callable[[], Any]]:
    names = [c.names[r] for r in range(1, n + 1)]
    view = c[1:n + 1]

    def loop() -> None:
        for name in names:
            rpc.rpc_sync(name, trivial)

    def async_all() -> None:
        for fut in [rpc.rpc_async(name, trivial) for name in names]:
            fut.wait()

    out = {"view": lambda: view.call(trivial), "rpc_sync loop": loop,
           "rpc_async, wait all": async_all}
    if rc is not None:
        dview = rc[:n]
        dview.block = True
        out["ipyparallel apply_sync"] = lambda: dview.apply_sync(trivial)
    return out


def measure(sizes: list[int], rounds: int, calls: int, ipp: bool) -> dict[str, Any]:
    """Per size and contender: each round's median time per call, in µs."""
    per: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
    cluster = rc = None
    c = nbdist.start(max(sizes), quiet=True)
    try:
        if ipp:
            import ipyparallel

            cluster = ipyparallel.Cluster(n=max(sizes), controller_ip="127.0.0.1",
                                          log_level=40)
            rc = cluster.start_and_connect_sync()
        for n in sizes:  # warm: code and globals reach every rank once
            for fn in _contenders(c, rc, n).values():
                fn()
        for _ in range(rounds):
            for n in sizes:
                for name, fn in _contenders(c, rc, n).items():
                    per[n].setdefault(name, []).append(
                        _median_us(fn, calls // 5 if "ipyparallel" in name else calls))
    finally:
        try:
            c.stop()
        finally:
            if rc is not None:
                rc.close()
            if cluster is not None:
                cluster.stop_cluster_sync()
    return {str(n): {name: {"median_us": statistics.median(v), "best_us": min(v),
                            "rounds_us": v} for name, v in per[n].items()} for n in sizes}


def _markdown(res: dict[str, Any]) -> str:
    sizes = list(res["results"])
    lines = ["# One call to many ranks: view vs rpc_sync loop vs ipyparallel", "",
             f"Measured at commit {res['commit']} on {res['machine']}, torch {res['torch']}, "
             f"{res['date']}; {res['rounds']} interleaved rounds of {res['calls']} calls "
             "(ipyparallel: a fifth as many). Median over rounds of each round's median, "
             "µs per call (best round in brackets). Rerun: `python bench/cells/views.py`.", "",
             "| contender | " + " | ".join(f"{n} rank{'s' if n != '1' else ''}"
                                          for n in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for name in CONTENDERS:
        cells = [res["results"][n].get(name) for n in sizes]
        if all(cell is None for cell in cells):
            continue
        lines.append(f"| {name} | " + " | ".join(
            "—" if cell is None else f"{cell['median_us']:.0f} ({cell['best_us']:.0f})"
            for cell in cells) + " |")
    lines += ["", f"`view` on {sizes[-1]} ranks / one `rpc_sync` to one rank: "
              f"**{res['view_vs_one_rpc_sync']:.2f}×** (the issue asks ≤ 1.5×); "
              f"`view` / plain torch's `rpc_async, wait all` on {sizes[-1]} ranks: "
              f"{res['view_vs_async_floor']:.2f}×.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    _common.add_arguments(ap)
    args = ap.parse_args()
    out = _common.out_dir(args)
    sizes, rounds, calls = ([1, 2], 2, 10) if args.smoke else ([1, 4, 8], 7, 200)
    results = measure(sizes, rounds, calls, ipp=not args.smoke)
    top, one = results[str(sizes[-1])], results["1"]
    res = {"commit": _common.measured_commit(), "date": datetime.date.today().isoformat(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "torch": torch.__version__,
           "rounds": rounds, "calls": calls, "results": results,
           "view_vs_one_rpc_sync": top["view"]["median_us"] / one["rpc_sync loop"]["median_us"],
           "view_vs_async_floor": top["view"]["median_us"]
           / top["rpc_async, wait all"]["median_us"]}
    (out / "views.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "views.md").write_text(_markdown(res))
    print(_markdown(res))


if __name__ == "__main__":
    main()
