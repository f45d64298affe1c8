"""What logging and RPC tracing cost: the metrics stream, a worker's slowdown, RPC latency.

``python bench/rpc/metrics.py [--quick]`` (part of ``make bench``). In one run:

1. **Stream**: 4 worker ranks each log ``--records`` records in a tight loop from one
   ``%%dist``-style cell; records/second end to end (cell start to the last record in rank 0's
   history), each worker's cost per ``nbdist.log`` call, and whether every record arrived in
   order.
2. **Slowdown**: each of the 4 workers runs a loop of small policy forward passes
   (``Linear(4,128) - ReLU - Linear(128,2) - softmax``, one observation), with and without an
   ``nbdist.log(reward=..)`` per step; on and off take turns, ``--reps`` times. Slowdown is
   the ratio of medians, by wall time and by the worker's CPU time (all its threads: the
   flusher that ships the records included). Also the delay from ``log`` on a worker to the
   record's arrival on rank 0.
3. **RPC latency**: ``rpc_sync`` echo of a one-element tensor to one worker, with nbdist's
   tracing on, tracing off (twice: the second is an A/A control that shows the noise), and
   in a plain torch world (two processes that never import nbdist: ``bench/rpc/_raw_rpc.py``);
   blocks of ``--calls`` calls, the modes taking turns in rotating order, ``--blocks`` times.
   Overhead of tracing = median(on) / median(off) - 1, also per round and best block.
4. **Drawing**: milliseconds to draw each dashboard panel from 4 ranks x 5,000 points.
5. **Memory**: 4 worker ranks each log 250,000 ``log(step=i, reward=float)``; how much the
   notebook process grows (RSS) holding the 1,000,000 records.
6. **Redraw with a million points**: a live dashboard (widgets) over 4 ranks x 250,000
   points; wall and CPU milliseconds of ``refresh()`` after one new record (the metrics panel
   redrawn from the bounded envelopes), and of the whole picture.

Writes ``bench/results/metrics.json`` and ``bench/results/metrics.md`` (naming the commit
measured) and prints them. ``--smoke``: 2 workers, tiny counts, a temporary directory.
``--only memory,redraw`` runs just those parts and updates the saved results.
Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc

import nbdist
from nbdist.telemetry import records, tracing

_FAMILY = Path(__file__).resolve().parent
sys.path[:0] = [str(_FAMILY), str(_FAMILY.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402
from _echo import echo  # noqa: E402

__all__ = ["bench_draw", "bench_memory", "bench_redraw", "bench_rpc", "bench_slowdown",
           "bench_stream", "main"]

HERE = Path(__file__).resolve().parent

SLOW_SETUP = """
import time, torch, nbdist
torch.manual_seed(0)
_nets = {
    "tiny": torch.nn.Sequential(torch.nn.Linear(4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 2)),
    "small": torch.nn.Sequential(torch.nn.Linear(4, 512), torch.nn.ReLU(),
                                 torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                 torch.nn.Linear(512, 2)),
}
_obs = torch.randn(1, 4)

def _policy_loop(n, log, net="tiny"):
    w0, c0 = time.perf_counter(), time.process_time()
    f = _nets[net]
    with torch.no_grad():
        for i in range(n):
            probs = torch.softmax(f(_obs), dim=1)
            if log:
                nbdist.log(reward=0.5, step=i)
    return time.perf_counter() - w0, time.process_time() - c0

def _alternate(steps, reps, net):
    # both ways, taking turns, reps times: ([(wall, cpu)] without log, [...] with log)
    out = {False: [], True: []}
    for rep in range(reps):
        for log in ((True, False) if rep % 2 == 0 else (False, True)):
            out[log].append(_policy_loop(steps, log, net))
        time.sleep(0.01)
    return out[False], out[True]

def _bare_log(n):
    c0 = time.process_time()
    for i in range(n):
        nbdist.log(reward=0.5, step=i)
    return time.process_time() - c0
"""


def _values(results: dict) -> dict[int, object]:
    return {r: ast.literal_eval(v) for r, v in results.items()}


def _wait_records(n: int, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while records.record_count() < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {records.record_count()} of {n} records arrived")
        time.sleep(0.001)
    return time.perf_counter()


def bench_stream(c: nbdist.Cluster, records: int) -> dict:
    """4 ranks log ``records`` each as fast as they can; end-to-end records/second."""
    nbdist.clear_history()
    ranks = list(range(1, c.world_size))
    t0 = time.perf_counter()
    vals = _values(c.run(f"import time, nbdist\n_t = time.perf_counter()\n"
                         f"for i in range({records}):\n    nbdist.log(i=i)\n"
                         f"time.perf_counter() - _t\n", show=False))
    t1 = _wait_records(records * len(ranks))
    rows = nbdist.history()
    in_order = all([r["i"] for r in rows if r["rank"] == k] == list(range(records))
                   for k in ranks)
    per_call_us = statistics.median(vals[k] / records * 1e6 for k in ranks)
    nbdist.clear_history()
    return {"ranks": len(ranks), "records_per_rank": records,
            "records_per_s": round(records * len(ranks) / (t1 - t0)),
            "seconds": round(t1 - t0, 3), "log_call_us_median": round(per_call_us, 3),
            "all_arrived_in_order": in_order}


def bench_slowdown(c: nbdist.Cluster, steps: int, reps: int, net: str = "tiny") -> dict:
    """Policy loop with vs without a log per step, on every worker at once.

    Best-of (min) is the headline: on a shared machine other load only ever adds time, to
    either side; medians are kept too.
    """
    c.run(SLOW_SETUP, show=False)
    c.run("_policy_loop(200, True)\n_policy_loop(200, False)", show=False)  # warm up
    delays: list[float] = []

    def arrival(records: list[dict]) -> None:
        now = time.time()
        delays.extend(now - r["time"] for r in records)

    records.subscribe(arrival)
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    bare: list[float] = []
    try:
        for off, on in _values(c.run(f"_alternate({steps}, {reps}, {net!r})",
                                     show=False)).values():
            for log, runs in ((False, off), (True, on)):
                wall[log].extend(w for w, _ in runs)
                cpu[log].extend(p for _, p in runs)
        for _ in range(5):
            bare.extend(_values(c.run(f"_bare_log({steps * 5})", show=False)).values())
        time.sleep(0.3)
    finally:
        records.unsubscribe(arrival)
    nbdist.clear_history()
    delays.sort()

    def pct(pick: Any, series: dict[bool, list[float]]) -> float:
        return round((pick(series[True]) / pick(series[False]) - 1) * 100, 2)

    return {
        "workers": c.world_size - 1, "net": net, "steps": steps, "reps": reps,
        "step_us_without_log": round(min(wall[False]) / steps * 1e6, 2),
        "step_us_with_log": round(min(wall[True]) / steps * 1e6, 2),
        "slowdown_wall_pct_best": pct(min, wall),
        "slowdown_cpu_pct_best": pct(min, cpu),
        "slowdown_wall_pct_median": pct(statistics.median, wall),
        "slowdown_cpu_pct_median": pct(statistics.median, cpu),
        "log_call_us_best": round(min(bare) / (steps * 5) * 1e6, 3),
        "delivery_ms_p50": round(delays[len(delays) // 2] * 1e3, 1) if delays else None,
        "delivery_ms_p95": round(delays[int(len(delays) * 0.95)] * 1e3, 1) if delays else None,
    }


class RawWorld:
    """Two plain torch processes (no nbdist): rank 0 runs echo blocks on request."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="nbdist-raw-")
        init = f"file://{self.dir}/rpc"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent)]),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, str(HERE / "_raw_rpc.py")]
        self.procs = [subprocess.Popen(cmd + [str(r), init], env=env, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                      for r in (0, 1)]
        line = self.procs[0].stdout.readline()
        if line.strip() != "ready":
            self.close()
            raise RuntimeError(f"plain torch world did not start: {line!r}")

    def block(self, calls: int) -> list[float]:
        p = self.procs[0]
        p.stdin.write(f"{calls}\n")
        p.stdin.flush()
        return json.loads(p.stdout.readline())

    def close(self) -> None:
        try:
            self.procs[0].stdin.write("quit\n")
            self.procs[0].stdin.flush()
        except (OSError, ValueError):
            pass
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def _nbdist_block(dest: str, calls: int) -> list[float]:
    x = torch.ones(1)
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        rpc.rpc_sync(dest, echo, args=(x,))
        lat.append((time.perf_counter() - t0) * 1e6)
    return lat


def bench_rpc(c: nbdist.Cluster, calls: int, blocks: int) -> dict:
    """rpc_sync echo latency: nbdist tracing on, off, and plain torch, taking turns."""
    dest = c.names[1]
    raw = RawWorld()
    lat: dict[str, list[float]] = {"tracing on": [], "tracing off": [], "plain torch": [],
                                   "tracing off (A/A control)": []}
    block_medians: dict[str, list[float]] = {k: [] for k in lat}
    try:
        _nbdist_block(dest, 200)  # warm up both
        raw.block(200)
        order = list(lat)
        for b in range(blocks):
            for mode in order[b % 4:] + order[: b % 4]:
                if mode == "plain torch":
                    got = raw.block(calls)
                else:
                    tracing.enable(mode == "tracing on", everywhere=False)  # off for A/A too
                    got = _nbdist_block(dest, calls)
                lat[mode].extend(got)
                block_medians[mode].append(statistics.median(got))
    finally:
        tracing.enable(True, everywhere=False)
        raw.close()
    traced = tracing.rpc_stats(callee=dest, function="echo")
    med = {k: statistics.median(v) for k, v in lat.items()}
    p95 = {k: sorted(v)[int(len(v) * 0.95)] for k, v in lat.items()}
    return {
        "calls_per_mode": calls * blocks, "blocks": blocks,
        "median_us": {k: round(v, 1) for k, v in med.items()},
        "p95_us": {k: round(v, 1) for k, v in p95.items()},
        "median_of_block_medians_us": {k: round(statistics.median(v), 1)
                                       for k, v in block_medians.items()},
        "tracing_overhead_pct": round((med["tracing on"] / med["tracing off"] - 1) * 100, 2),
        "tracing_overhead_pct_block_medians": round(
            (statistics.median(block_medians["tracing on"])
             / statistics.median(block_medians["tracing off"]) - 1) * 100, 2),
        # each round runs the three modes back to back: compare within a round
        "tracing_overhead_us_paired": round(statistics.median(
            a - b for a, b in zip(block_medians["tracing on"], block_medians["tracing off"],
                                  strict=True)), 1),
        "noise_us_paired_a_a": round(statistics.median(
            a - b for a, b in zip(block_medians["tracing off (A/A control)"],
                                  block_medians["tracing off"], strict=True)), 1),
        "tracing_overhead_pct_best": round(
            (min(block_medians["tracing on"]) / min(block_medians["tracing off"]) - 1) * 100, 2),
        "nbdist_on_vs_plain_torch_pct": round((med["tracing on"] / med["plain torch"] - 1)
                                              * 100, 2),
        "traced_calls_counted": traced.total(),
    }


def bench_draw(reps: int = 3) -> dict:
    """Milliseconds to draw each dashboard panel (4 ranks x 5,000 steps, 5,000 RPCs)."""
    import math

    from nbdist.display import render

    n = 5000
    series = {"reward": {r: (list(range(n)), [math.sin(i / 50) + r for i in range(n)])
                         for r in range(1, 5)}}
    now = time.time()
    samples = [(now + i / 500, "worker0", f"worker{1 + i % 4}", "echo", 3e-4 + (i % 7) * 1e-5,
                600) for i in range(n)]
    rows = [{"rank": r, "name": f"worker{r}", "alive": True, "state": "alive", "cpu": 50.0,
             "mem_mb": 250.0} for r in range(5)]
    snap = render.Snapshot(series=series, samples=samples, rows=rows,
                           names={r: f"worker{r}" for r in range(5)},
                           timings=[{"observers": 4, "mode": "batched", "seconds": 1.0}])
    out = {}
    for name, make in (("metrics", render.metrics_figure), ("rpc", render.latency_figure),
                       ("timings", render.timings_figure), ("everything", render.dashboard_figure)):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            render.to_png(make(snap))
            times.append(time.perf_counter() - t0)
        out[name] = round(statistics.median(times) * 1e3, 1)
    return out


def _rss() -> int:
    import psutil

    gc.collect()
    return psutil.Process().memory_info().rss


def bench_memory(per_rank: int = 250_000, workers: int = 4) -> dict:
    """Notebook RSS growth for ``workers`` ranks x ``per_rank`` records of one float each."""
    nbdist.clear_history()
    c = nbdist.start(workers, quiet=True)
    try:
        before = _rss()
        t0 = time.perf_counter()
        c.run(f"import random, nbdist\nfor i in range({per_rank}):\n"
              f"    nbdist.log(step=i, reward=random.random())\n", show=False)
        seconds = time.perf_counter() - t0
        n = records.record_count()
        grown = _rss() - before
    finally:
        c.stop()
        nbdist.clear_history()
    return {"records": n, "rss_growth_mb": round(grown / 1e6, 1),
            "bytes_per_record": round(grown / n, 1), "seconds": round(seconds, 1)}


def _fill(per_rank: int) -> None:
    """Deliver 4 ranks x ``per_rank`` records to the history the way worker batches arrive."""
    for r in range(1, 5):
        for b in range(0, per_rank, 20_000):
            rows = [(i, time.time(), {"reward": random.random()})
                    for i in range(b, min(b + 20_000, per_rank))]
            records.deliver((r, f"worker{r}", rows, []))


def bench_redraw(per_rank: int = 250_000, reps: int = 9) -> dict:
    """A live dashboard over 4 x ``per_rank`` points: refresh after one new record."""
    from nbdist.display import Dashboard

    nbdist.clear_history()
    _fill(per_rank)
    t0 = time.perf_counter()
    d = Dashboard(widgets=True)
    attach = time.perf_counter() - t0
    d.refresh(force=True)
    wall, cpu = [], []
    for k in range(reps):
        records.deliver((1, "worker1", [(per_rank + k, time.time(), {"reward": 0.5})], []))
        w0, c0 = time.perf_counter(), time.thread_time()
        d.refresh()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    drawn = max(len(c[0]) for c in d.snapshot().series["reward"].values())
    w0, c0 = time.perf_counter(), time.thread_time()
    d.png()
    whole = (time.perf_counter() - w0, time.thread_time() - c0)
    d.close()
    nbdist.clear_history()
    return {"points": 4 * per_rank, "attach_ms": round(attach * 1e3, 1),
            "refresh_wall_ms_median": round(statistics.median(wall) * 1e3, 1),
            "refresh_cpu_ms_median": round(statistics.median(cpu) * 1e3, 1),
            "whole_picture_wall_ms": round(whole[0] * 1e3, 1),
            "whole_picture_cpu_ms": round(whole[1] * 1e3, 1),
            "points_drawn_per_curve": drawn}


def _markdown_bounded(res: dict) -> list[str]:
    lines = []
    if "memory_redraw_when" in res:
        lines += [f"Memory and redraw measured {res['memory_redraw_when']}, load average (1m) "
                  f"{res['memory_redraw_load']} at the end.", ""]
    if "memory" in res:
        m = res["memory"]
        lines += ["## Memory: a million records in the notebook", "",
                  "| records (4 ranks) | notebook RSS growth | per record | logged and "
                  "received in |", "|---|---|---|---|",
                  f"| {m['records']:,} | {m['rss_growth_mb']} MB | {m['bytes_per_record']} B "
                  f"| {m['seconds']} s |", ""]
    if "redraw" in res:
        r = res["redraw"]
        lines += ["## Redraw with a million points", "",
                  "A live dashboard (widgets) over 4 ranks x 250,000 points of `reward`: "
                  "`refresh()` after one new record redraws the metrics panel from the "
                  "bounded envelopes (each curve at most "
                  f"{r['points_drawn_per_curve']} points, every bucket's min and max kept). "
                  "CPU = this thread's CPU time (the machine is shared: wall time includes "
                  "waiting for a core).", "",
                  "| points | refresh wall (median) | refresh CPU (median) | whole picture "
                  "wall / CPU | dashboard attach |", "|---|---|---|---|---|",
                  f"| {r['points']:,} | {r['refresh_wall_ms_median']} ms | "
                  f"{r['refresh_cpu_ms_median']} ms | {r['whole_picture_wall_ms']} / "
                  f"{r['whole_picture_cpu_ms']} ms | {r['attach_ms']} ms |", ""]
    return lines


def _markdown(res: dict) -> str:
    s, r, d = res["stream"], res["rpc"], res["draw_ms"]
    w1 = res["slowdown"][-1]
    lines = [
        "# Metrics stream and RPC tracing (bench/rpc/metrics.py)", "",
        f"{res['when']} · {res['cores']} cores · load average (1m) {res['load_start']} at start,"
        f" {res['load_end']} at end · torch {res['torch']} · Python {res['python']}"
        f" · nbdist at {res.get('commit', '?')}", "",
        "## Stream: 4 ranks logging as fast as they can", "",
        "| ranks x records | end-to-end records/s | wall time per log in the loop (4 ranks "
        "sharing 2 cores) | all arrived in order |",
        "|---|---|---|---|",
        f"| {s['ranks']} x {s['records_per_rank']:,} | {s['records_per_s']:,} | "
        f"{s['log_call_us_median']} µs | {s['all_arrived_in_order']} |", "",
        "## Slowdown of a worker's loop by logging every step", "",
        "Policy steps on one observation: `tiny` = `Linear(4,128)-ReLU-Linear(128,2)-softmax`, "
        "`small` = `Linear(4,512)-ReLU-Linear(512,512)-ReLU-Linear(512,2)-softmax`; "
        f"{w1['reps']} loops each way, taking turns inside the "
        "worker. Best-of (min) time: other load on a shared machine only adds. CPU = the "
        "worker process's CPU time, all threads (the flusher that ships the records "
        "included; on a virtual machine it also counts time stolen by the host). "
        "`nbdist.log alone`: CPU per call of a bare logging loop, flusher included.", "",
        "| workers | policy | step without log | step with log | slowdown wall (best / median) "
        "| slowdown CPU (best / median) | nbdist.log alone | log → rank 0 p50 / p95 |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {x['workers']} | {x['net']} | {x['step_us_without_log']} µs | "
          f"{x['step_us_with_log']} µs | "
          f"{x['slowdown_wall_pct_best']}% / {x['slowdown_wall_pct_median']}% | "
          f"{x['slowdown_cpu_pct_best']}% / {x['slowdown_cpu_pct_median']}% | "
          f"{x['log_call_us_best']} µs | {x['delivery_ms_p50']} / {x['delivery_ms_p95']} ms |"
          for x in res["slowdown"]], "",
        "With 4 workers on 2 cores the machine is oversubscribed: rank 0 receiving the records "
        "competes with the workers for the same cores, so wall time shows more than the "
        "worker's own cost.", "",
        "## rpc_sync echo (one-element tensor), rank 0 → one worker", "",
        f"{r['calls_per_mode']:,} calls per mode in {r['blocks']} blocks, modes taking turns.",
        "", "| mode | median µs | p95 µs | median of block medians µs |", "|---|---|---|---|",
    ]
    for k in r["median_us"]:
        lines.append(f"| {k} | {r['median_us'][k]} | {r['p95_us'][k]} | "
                     f"{r['median_of_block_medians_us'][k]} |")
    lines += [
        "", f"Tracing overhead (on vs off): **{r['tracing_overhead_pct']}%** of the median "
        f"({r['tracing_overhead_pct_block_medians']}% by block medians; "
        f"{r['tracing_overhead_us_paired']} µs per call comparing blocks of the same round, "
        f"where the A/A control, off vs off, differs by {r['noise_us_paired_a_a']} µs; "
        f"{r['tracing_overhead_pct_best']}% comparing the best blocks). nbdist with tracing "
        f"vs plain torch: {r['nbdist_on_vs_plain_torch_pct']}%. Calls counted by "
        f"rpc_stats: {r['traced_calls_counted']:,}.", "",
        "## Drawing the dashboard (4 ranks x 5,000 steps, 5,000 RPCs)", "",
        "| panel | ms |", "|---|---|", *[f"| {k} | {v} |" for k, v in d.items()], "",
        *_markdown_bounded(res),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts (a minute or so)")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--calls", type=int, default=None)
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--only", default=None, help="comma-separated parts: memory, redraw "
                    "(updates the saved results)")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    out = _common.out_dir(args)
    if args.only:
        return _run_only(args.only.split(","), out)
    q, smoke = args.quick, args.smoke
    records = args.records or (50 if smoke else 5000 if q else 20000)
    steps = args.steps or (20 if smoke else 1000)
    reps = args.reps or (2 if smoke else 10 if q else 40)
    calls = args.calls or (5 if smoke else 100 if q else 150)
    blocks = args.blocks or (2 if smoke else 12 if q else 48)
    res: dict = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "commit": _common.measured_commit(), "cores": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "load_start": round(os.getloadavg()[0], 1), "smoke": smoke}
    c = nbdist.start(2 if smoke else 4, quiet=True)
    try:
        res["stream"] = bench_stream(c, records)
        print("stream:", res["stream"], flush=True)
        res["slowdown"] = []
        for cluster_size in (4, 1):
            if cluster_size == 1:
                c = c.restart(1, quiet=True)
            for net in ("tiny", "small"):
                row = bench_slowdown(c, steps if net == "tiny" else steps // 4, reps, net)
                res["slowdown"].append(row)
                print("slowdown:", row, flush=True)
        tracing.clear()
        res["rpc"] = bench_rpc(c, calls, blocks)
        print("rpc:", res["rpc"], flush=True)
    finally:
        c.stop()
    if smoke:
        res["draw_ms"] = bench_draw(reps=1)
        res["memory"] = bench_memory(per_rank=500, workers=2)
        res["redraw"] = bench_redraw(per_rank=1000, reps=2)
    else:
        res["draw_ms"] = bench_draw()
        res["memory"] = bench_memory()
        res["redraw"] = bench_redraw()
    res["load_end"] = round(os.getloadavg()[0], 1)
    _save(res, out)
    return 0


def _save(res: dict, out: Path) -> None:
    (out / "metrics.json").write_text(json.dumps(res, indent=2) + "\n")
    md = _markdown(res)
    (out / "metrics.md").write_text(md)
    print(md)


def _run_only(parts: list[str], out: Path) -> int:
    """Run some parts and merge them into the saved results."""
    res = json.loads((out / "metrics.json").read_text())
    runners = {"memory": bench_memory, "redraw": bench_redraw}
    for part in parts:
        if part not in runners:
            raise SystemExit(f"--only: unknown part {part!r}; pick from {sorted(runners)}")
        res[part] = runners[part]()
        print(f"{part}:", res[part], flush=True)
    res[f"{'_'.join(parts)}_when"] = datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds")
    res[f"{'_'.join(parts)}_load"] = round(os.getloadavg()[0], 1)
    res["commit"] = _common.measured_commit()
    _save(res, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
