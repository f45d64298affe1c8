"""Part of ``bench/startup/startup.py``: how restart time and the ``%%dist`` round trip grow with N,
and the warm first start (``%load_ext nbdist`` then ``%dist_start 4`` a second later).

Growth: in this process, for N = 1, 2, 4, 8, 16 (on 2 cores, 8 and 16 are oversubscribed:
more busy processes than cores while they start), ``restart(N)`` time and ``%%dist x=1``
through an IPython shell; a power law ``t = a * N^b`` fitted by least squares on log-log
(over the N that are not oversubscribed, and over all) and its value at N = 64.

First start: fresh child processes (no template) do ``%load_ext nbdist``, wait one second
(the user types the next cell), then time ``%dist_start 4``; with ``NBDIST_PREWARM=0`` for
comparison; the two take turns. The warm template's RSS is recorded (what prewarm costs).

Writes ``startup_growth.json``, ``startup_growth.md`` and ``startup_growth.png``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["first_start", "fit", "growth", "render", "run_and_write"]

FIRST_START_CHILD = r'''
import json, os, sys, time
import psutil
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config
cfg = Config()
cfg.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=cfg)
shell.run_line_magic("load_ext", "nbdist")
time.sleep(float(sys.argv[1]))  # the user reads, types the next cell
from nbdist.cluster.session import session
t = time.perf_counter()
shell.run_line_magic("dist_start", "4")
start = time.perf_counter() - t
pid = session().template_pid()
rss = psutil.Process(pid).memory_info().rss if pid else None
shell.run_line_magic("dist_stop", "")
print("RESULT " + json.dumps({"start_s": start, "template_rss": rss}), flush=True)
'''


def first_start(reps: int, pause: float = 1.0, later: float = 5.0,
                timeout: float = 180.0,
                modes: tuple[str, ...] = ("prewarm", "no_prewarm", "prewarm_later")) -> dict:
    """``%dist_start 4`` ``pause`` seconds after ``%load_ext nbdist``, prewarm on vs off, and
    with prewarm ``later`` seconds after (torch's import in the template is over by then)."""
    out: dict[str, list] = {"prewarm": [], "no_prewarm": [], "prewarm_later": [],
                            "template_rss_mb": []}
    for rep in range(reps):
        k = rep % len(modes)
        for mode in modes[k:] + modes[:k]:
            env = dict(os.environ, NBDIST_PREWARM="0" if mode == "no_prewarm" else "1")
            wait = later if mode == "prewarm_later" else pause
            proc = subprocess.run([sys.executable, "-c", FIRST_START_CHILD, str(wait)],
                                  env=env, capture_output=True, text=True, timeout=timeout)
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"first-start child failed: {proc.stderr[-2000:]}")
            r = json.loads(lines[0][len("RESULT "):])
            out[mode].append(r["start_s"])
            if mode != "no_prewarm" and r["template_rss"]:
                out["template_rss_mb"].append(r["template_rss"] / 2**20)
            print(f"first start ({mode}): {r['start_s']:.2f}s", flush=True)
    return {"pause_s": pause, "later_s": later, "samples": out,
            "median_s": {k: statistics.median(v) for k, v in out.items()
                         if v and k != "template_rss_mb"},
            "template_rss_mb": statistics.median(out["template_rss_mb"])
            if out["template_rss_mb"] else None}


def growth(ns: list[int], restarts: int, cells: int) -> dict:
    """Restart time and ``%%dist x=1`` round trip for each N, in this process."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    import nbdist

    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=cfg)
    nbdist.load_ipython_extension(shell)
    res: dict[str, Any] = {"restart_s": {}, "cell_ms": {}}
    c = nbdist.current() or nbdist.start(1, quiet=True)
    try:
        for n in ns:
            c = c.restart(n, quiet=True)  # first world of this size: not counted
            times = []
            for _ in range(restarts):
                t = time.perf_counter()
                c = c.restart(n, quiet=True)
                times.append(time.perf_counter() - t)
            for _ in range(5):
                shell.run_cell("%%dist\nx=1\n", store_history=False)
            lat = []
            for _ in range(cells):
                t = time.perf_counter()
                ok = shell.run_cell("%%dist\nx=1\n", store_history=False).success
                lat.append(time.perf_counter() - t)
                if not ok:
                    raise RuntimeError(f"%%dist failed at N={n}")
            # best of: on a shared machine others' load only ever adds time (medians kept too)
            res["restart_s"][n] = min(times)
            res["cell_ms"][n] = min(statistics.median(lat[i:i + 10]) for i in
                                    range(0, len(lat), 10)) * 1e3
            res.setdefault("restart_median_s", {})[n] = statistics.median(times)
            res.setdefault("cell_median_ms", {})[n] = statistics.median(lat) * 1e3
            print(f"N={n}: restart {res['restart_s'][n]:.3f}s, %%dist "
                  f"{res['cell_ms'][n]:.2f} ms (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        c.stop()
    return res


def fit(points: dict[int, float]) -> dict:
    """Least squares on log-log: ``t = a * N^b``; the value at N = 64."""
    xs = [math.log(n) for n in points]
    ys = [math.log(v) for v in points.values()]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = math.exp(my - b * mx)
    return {"a": a, "b": b, "at_64": a * 64 ** b, "ns": list(points)}


def plot(res: dict, path: Path, cores: int, commit: str = "unknown") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "restart_s", "restart (s)"),
                           (axes[1], "cell_ms", "%%dist x=1 round trip (ms)")):
        pts = res[key]
        ns = sorted(pts)
        ax.loglog(ns, [pts[n] for n in ns], "o-", label="measured")
        f = res["fits"][key]["within_cores"]
        grid = [1, 2, 4, 8, 16, 32, 64]
        ax.loglog(grid, [f["a"] * n ** f["b"] for n in grid], "--",
                  label=f"fit N<={max(f['ns'])}: N^{f['b']:.2f}")
        ax.axvspan(cores, max(ns), color="grey", alpha=0.15, label=f"> {cores} cores")
        ax.set_xlabel("worker ranks N")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Description": f"nbdist bench at {commit}"})
    plt.close(fig)


def render(res: dict) -> str:
    cores = res["cores"]
    lines = ["# Start-up: growth with N, and the warm first start", "",
             f"nbdist at {res.get('commit', '?')}; "
             f"{cores} cores, load {res['load']:.1f} at start. N = 8 and 16 are "
             f"oversubscribed here ({cores} cores): their times include waiting for a core.", "",
             "Restart: best of the restarts; `%%dist`: best median of blocks of 10 "
             "(medians of all in the JSON). The fits use these.", "",
             "| N | restart | `%%dist x=1` |", "|---|---|---|"]
    for n in res["growth"]["restart_s"]:
        lines.append(f"| {n} | {res['growth']['restart_s'][n]:.3f} s | "
                     f"{res['growth']['cell_ms'][n]:.2f} ms |")
    for key, what, unit, scale in (("restart_s", "restart", "s", 1.0),
                                   ("cell_ms", "`%%dist` round trip", "ms", 1.0)):
        fw = res["growth"]["fits"][key]["within_cores"]
        fa = res["growth"]["fits"][key]["all"]
        lines += ["", f"{what}: t ∝ N^{fw['b']:.2f} fitted over N ≤ {max(fw['ns'])} "
                      f"(N^{fa['b']:.2f} over all N, oversubscribed ones included); by the "
                      f"first fit a 64-rank world on a 64-core machine: "
                      f"{fw['at_64'] * scale:.2f} {unit}."]
    lines += ["", "What grows: a restart forks N workers and runs `init_rpc`, whose "
              "rendezvous and Gloo group form a full mesh (N² connections), and rank 0 "
              "handshakes every worker's control socket; `%%dist` sends one message per rank "
              "and waits for all.", "", "![growth](startup_growth.png)"]
    fs = res.get("first_start")
    if fs:
        med = fs["median_s"]
        lines += ["", "## Warm first start", "",
                  f"`%load_ext nbdist`, {fs['pause_s']:.0f} s pause, then `%dist_start 4`, in "
                  "fresh processes (median of the runs, the two modes taking turns):", "",
                  "| mode | `%dist_start 4` |", "|---|---|",
                  f"| prewarm (default) | {med.get('prewarm', float('nan')):.2f} s |",
                  f"| `NBDIST_PREWARM=0` | {med.get('no_prewarm', float('nan')):.2f} s |",
                  f"| prewarm, {fs['later_s']:.0f} s after `%load_ext` | "
                  f"{med.get('prewarm_later', float('nan')):.2f} s |", "",
                  "A second is enough where `import torch` takes under a second (an idle "
                  "machine); on a loaded one the template is still importing torch then."]
        if fs.get("template_rss_mb"):
            lines.append(f"The idle template costs one process of about "
                         f"{fs['template_rss_mb']:.0f} MB RSS (torch imported).")
    return "\n".join(lines) + "\n"


def run_and_write(out: Path, quick: bool, smoke: bool = False,
                  commit: str = "unknown") -> dict:
    """Growth and first start; writes startup_growth.{json,md,png} under ``out``.

    ``smoke``: N = 1 and 2, one restart, ten cells, one first start with prewarm.
    """
    ns = [1, 2] if smoke else [1, 2, 4, 8, 16]
    cores = os.cpu_count() or 1
    res: dict[str, Any] = {"commit": commit, "cores": cores, "load": os.getloadavg()[0],
                           "quick": quick, "smoke": smoke}
    g = growth(ns, restarts=1 if smoke else 3 if quick else 5,
               cells=10 if smoke else 30 if quick else 100)
    g["fits"] = {}
    for key in ("restart_s", "cell_ms"):
        pts = g[key]
        within = {n: v for n, v in pts.items() if n <= max(cores, 2) * 2}
        g["fits"][key] = {"within_cores": fit(within), "all": fit(pts)}
    res["growth"] = g
    if smoke:
        res["first_start"] = first_start(reps=1, pause=0.2, modes=("prewarm",))
    else:
        res["first_start"] = first_start(reps=3 if quick else 6)
    out.mkdir(parents=True, exist_ok=True)
    plot(g, out / "startup_growth.png", cores, commit)
    (out / "startup_growth.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    md = render(res)
    (out / "startup_growth.md").write_text(md)
    print(md)
    return res
