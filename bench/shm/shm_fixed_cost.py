"""Where the shared-memory path's time goes in one message, and where it beats TensorPipe.

``python bench/shm/shm_fixed_cost.py`` (part of ``make bench``; issue 35). This process is rank 0
of ``nbdist.start(1)``; it echoes one float32 tensor to ``worker1`` and back.

- **Breakdown**: timing probes are wrapped (here, by this script, in both processes) around the
  path's steps: the slot claim (``Arena.alloc``), the copy into the slot, the descriptor's
  pickling, the receiver's decode (mapping the peer's arena, prefaulting the slot, claiming it,
  building the tensors) and the freeing (``PeerArena.give_back``); the echo function stamps its
  entry and exit. Every stamp is ``time.monotonic_ns`` (one clock for every process of a
  host), so the gaps between them are the RPC messages themselves and the wake-ups. Minor page
  faults are counted per thread around the copy and the decode. The first echo of a size in a
  fresh world is **cold** (the peer's arena is mapped, a fresh slot is carved and faulted in);
  the best of N later echoes is **warm** (cached mapping, reused slot). Each phase: best of N.
- **Threshold sweep**: at 1, 2, 4, 8, 16 and 64 MB, echoes with the path on and off (the
  threshold raised above the size in both processes: TensorPipe carries the tensor, through
  the same nbdist pickler) alternate call by call in one world, probes removed; reported:
  best and median of each, and the ratio off/on (> 1: the path is faster).

Writes ``bench/results/shm_fixed_cost.json`` and ``shm_fixed_cost.md``; ``--smoke``: 1 and
2 MB, a few calls, results to a temporary directory. Every process it starts is stopped.
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
from pathlib import Path

import torch
import torch.distributed.rpc as rpc

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402
from _shm_probes import (  # noqa: E402
    clear,
    echo,
    install_probes,
    records,
    remove_probes,
    set_min_bytes,
    set_threaded_copy,
)

import nbdist  # noqa: E402

__all__ = ["CONTENDERS", "SWEEP", "breakdown", "main", "render", "sweep"]

MB = 1 << 20
PEER = "worker1"
_now = time.monotonic_ns


def _first(recs: list, name: str, after: int = 0) -> tuple | None:
    for r in recs:
        if r[0] == name and r[1] >= after:
            return r
    return None


def _phases(t0: int, t1: int, mine: list, theirs: list) -> dict[str, float]:
    """One echo's phases in microseconds, from both processes' records."""
    us = 1e-3
    e_in, e_out = _first(theirs, "echo in"), _first(theirs, "echo out")
    p: dict[str, float] = {}
    p["0 pickle request (until the tensor)"] = (_first(mine, "seal")[1] - t0) * us
    sealed = _seal_phases(p, "0", mine)
    d1 = _decode_phases(p, "1", theirs, sealed, "request message + wake-up")
    p["1 unpickle rest + dispatch"] = (e_in[1] - d1[2]) * us
    p["1 reply pickle (until the tensor)"] = (_first(theirs, "seal")[1] - e_out[1]) * us
    sealed = _seal_phases(p, "1", theirs)
    d0 = _decode_phases(p, "0", mine, sealed, "reply message + wake-up")
    p["0 future wake-up until rpc_sync returns"] = (t1 - d0[2]) * us
    p["echo total (ms)"] = (t1 - t0) * 1e-6
    return p


def _seal_phases(p: dict, who: str, recs: list) -> int:
    """A sender's slot claim, copy and descriptor; returns when its descriptor was ready."""
    s, c, w = _first(recs, "seal"), _first(recs, "claim"), _first(recs, "written")
    p[f"{who} slot claim"] = (c[2] - c[1]) * 1e-3
    p[f"{who} copy into slot"] = (w[1] - c[2]) * 1e-3
    p[f"{who} claim + copy: minor faults"] = float(s[3])
    p[f"{who} descriptor pickle"] = (s[2] - w[1]) * 1e-3
    return s[2]


def _decode_phases(p: dict, who: str, recs: list, sent: int, gap: str) -> tuple:
    """The message's transit (``gap``) and a receiver's decode; returns the decode record."""
    d = _first(recs, "decode")
    p[gap] = (d[1] - sent) * 1e-3
    p[f"{who} decode total"] = (d[2] - d[1]) * 1e-3
    for name in ("map peer", "prefault", "hold"):
        r = _first(recs, name, d[1])
        p[f"{who}   {name}"] = (r[2] - r[1]) * 1e-3 if r and r[2] <= d[2] else 0.0
    p[f"{who} decode: minor faults"] = float(d[3])
    return d


def _free_us(recs: list) -> float:
    r = [x for x in recs if x[0] == "free"]
    return sum(x[2] - x[1] for x in r) * 1e-3


CONTENDERS = ("memmove", "threaded copy")  # today's copy into a slot, and the one before


def _set_copy(mode: str) -> None:
    on = mode == "threaded copy"
    set_threaded_copy(on)
    rpc.rpc_sync(PEER, set_threaded_copy, args=(on,))


def breakdown(nbytes: int, n: int) -> dict:
    """A fresh world: the first echo (cold, today's copy) then ``n`` echoes of each copy
    contender, alternating call by call (warm), phase by phase."""
    c = nbdist.start(1, worker_name="worker{rank}", threads=1, quiet=True)
    runs: dict[str, list] = {m: [] for m in CONTENDERS}
    try:
        install_probes()
        rpc.rpc_sync(PEER, install_probes)
        x = torch.ones(nbytes // 4)
        for i in range(2 * n + 1):
            mode = CONTENDERS[(i + i // 2) % 2] if i else CONTENDERS[0]
            _set_copy(mode)
            clear()
            rpc.rpc_sync(PEER, clear)
            t0 = _now()
            r = rpc.rpc_sync(PEER, echo, args=(x,))
            t1 = _now()
            del r  # frees the worker's slot here
            mine = records()
            theirs = rpc.rpc_sync(PEER, records)  # the worker freed ours by now
            p = _phases(t0, t1, mine, theirs)
            p["0 free (give_back) us"] = _free_us(mine)
            p["1 free (give_back) us"] = _free_us(theirs)
            runs["cold" if not i else mode] = [p] if not i else runs[mode] + [p]
        _set_copy(CONTENDERS[0])
        rpc.rpc_sync(PEER, remove_probes)
        remove_probes()
        del x
    finally:
        c.stop()
    cold = runs.pop("cold")[0]
    out: dict = {"cold": cold}
    for mode, rs in runs.items():
        out[mode] = {"best": {k: min(r[k] for r in rs) for k in cold},
                     "median": {k: statistics.median(r[k] for r in rs) for k in cold}}
    return out


SWEEP = ("memmove", "threaded copy", "off")  # path on (today), on as before, off: TensorPipe


def sweep(sizes_mb: list[int], n: int) -> dict:
    """Echo with the path on (today's copy and the one before) and off, rotating call by
    call, in one world."""
    c = nbdist.start(1, worker_name="worker{rank}", threads=1, quiet=True)
    out = {}
    try:
        for mb in sizes_mb:
            nbytes = mb * MB
            x = torch.ones(nbytes // 4)
            times: dict[str, list[float]] = {m: [] for m in SWEEP}
            for i in range(3 * (n + 1)):
                mode = SWEEP[(i + i // 3) % 3]  # the order rotates every round
                limit = nbytes + 1 if mode == "off" else 1
                set_min_bytes(limit)
                rpc.rpc_sync(PEER, set_min_bytes, args=(limit,))
                if mode != "off":
                    _set_copy(mode)
                t = time.perf_counter()
                r = rpc.rpc_sync(PEER, echo, args=(x,))
                times[mode].append(time.perf_counter() - t)
                del r
            cell = {}
            for m, ts in times.items():
                ts = ts[1:]  # the first of each: warm-up
                cell[m] = {"best_ms": min(ts) * 1e3, "median_ms": statistics.median(ts) * 1e3,
                           "n": len(ts)}
            out[f"{mb} MB"] = cell
            del x
        _set_copy(CONTENDERS[0])
    finally:
        c.stop()
    return out


def render(res: dict) -> str:
    lines = ["# The shared-memory path: one message's fixed cost, and the threshold",
             "",
             f"Measured at commit {res['commit']} on {res['machine']} ({res['cpus']} CPUs; "
             f"{res['load']}), torch {res['torch']}, {res['when']}. "
             "Written by `python bench/shm/shm_fixed_cost.py`.",
             "",
             "## One echo to worker1 and back, phase by phase (µs; faults: count)",
             "",
             "Rank 0 (this process, torch's default threads) is `0`, worker1 (1 thread) is "
             "`1`. **Cold**: the first echo of that size in a fresh world (the peer's arena "
             "mapped, a fresh slot carved and faulted in). Then, alternating call by call in "
             f"the same world, {res['n_breakdown']} echoes each (cached mapping, reused slot) "
             "copying into the slot with **memmove** (today: one `memmove` below 64 MB) and "
             "with **threaded copy** (before: torch's `copy_`, which wakes its thread pool). "
             "Best and median of each phase on its own, so the bests do not add up to the "
             "best total. Gaps between stamps (message + wake-up) are the TensorPipe "
             "message, its threads and the scheduler.",
             ""]
    sizes = list(res["breakdown"])
    cols = [f"{s} cold" for s in sizes]
    for s in sizes:
        cols += [f"{s} {m} {q}" for m in CONTENDERS for q in ("best", "median")]
    lines += ["| phase | " + " | ".join(cols) + " |", "|---" * (1 + len(cols)) + "|"]
    keys = list(res["breakdown"][sizes[0]]["cold"])
    for k in keys:
        cells = [f"{res['breakdown'][s]['cold'][k]:.1f}" for s in sizes]
        for s in sizes:
            b = res["breakdown"][s]
            cells += [f"{b[m][q][k]:.1f}" for m in CONTENDERS for q in ("best", "median")]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["",
              "## Path on vs off, rotating call by call in one world",
              "",
              f"Echo of one float32 tensor to worker1 and back, {res['n_sweep']} calls each "
              "(after one warm-up): **on** with today's copy (memmove), **on, threaded** "
              "(the copy before), **off** (the threshold raised above the size: TensorPipe "
              "carries the tensor, through the same pickler). off/on > 1: the path is "
              "faster.",
              "",
              "| size | on best ms | on, threaded best ms | off best ms | off/on best "
              "| off/on-threaded best | on median ms | on, threaded median ms | off median ms "
              "| off/on median | off/on-threaded median |",
              "|---" * 11 + "|"]
    for s, v in res["sweep"].items():
        on, th, off = v["memmove"], v["threaded copy"], v["off"]
        lines.append(
            f"| {s} | {on['best_ms']:.2f} | {th['best_ms']:.2f} | {off['best_ms']:.2f} | "
            f"{off['best_ms'] / on['best_ms']:.2f} | {off['best_ms'] / th['best_ms']:.2f} | "
            f"{on['median_ms']:.2f} | {th['median_ms']:.2f} | {off['median_ms']:.2f} | "
            f"{off['median_ms'] / on['median_ms']:.2f} | "
            f"{off['median_ms'] / th['median_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="echoes per phase table / sweep cell")
    ap.add_argument("--load", default="a shared machine",
                    help="what else loaded the machine, for the results file")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    os.environ["NBDIST_SHM"] = "1"
    if args.smoke:
        n, sizes, table = args.n or 3, [1, 2], [2]
    else:
        n, sizes, table = args.n or 24, [1, 2, 4, 8, 16, 64], [2, 16]
    res: dict = {"commit": _common.measured_commit(), "machine": platform.node(),
                 "cpus": os.cpu_count(), "load": args.load, "torch": torch.__version__,
                 "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 "n_breakdown": n, "n_sweep": n, "breakdown": {}, "sweep": {}}
    for mb in table:
        res["breakdown"][f"{mb} MB"] = breakdown(mb * MB, n)
    res["sweep"] = sweep(sizes, n)
    out = _common.out_dir(args)
    (out / "shm_fixed_cost.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "shm_fixed_cost.md").write_text(render(res))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
