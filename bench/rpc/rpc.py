"""RPC at torch's own speed? nbdist (notebook-defined functions) vs plain torch vs ipyparallel.

``python bench/rpc/rpc.py [--quick]`` (part of ``make bench``). In one run, in interleaved rounds
(the order flips every round, so a busy spell of a shared machine hits both sides):

- **plain torch**: two processes that never import nbdist (``_rpc_plain.py``), the function
  and the class imported by reference from a module (``_echo.py``);
- **nbdist**: this process is rank 0 of ``nbdist.start(1)``; the function and class are
  defined in ``__main__`` (this script), as a notebook cell defines them, so they travel by
  value; tracing and output routing are on (the defaults).

Each does, for payloads of 16 B, 64 KB, 1 MB, 16 MB and 64 MB (float32 tensors, echoed back):
``rpc_sync`` (latency), ``rpc_async`` (pipelined windows: time per call), ``remote`` (then
``to_here``) and a proxy call ``rref.rpc_sync().echo(x)`` on an object held in an RRef.
Then ipyparallel, the peer a notebook user would otherwise pick: one engine on loopback,
``apply_sync(echo, x)`` and ``push({'x': x})`` + ``pull('x')`` of the same tensors.

Reported: median, p10, p90 and best per call, and the ratios nbdist / plain of medians and of
bests (and ipyparallel / plain). Absolute times on a shared 2-core machine are noisy; the
ratios come from interleaved rounds of the same run. For large payloads (16 MB, 64 MB) a
median swings 0.6-1.8x between runs on this machine, the best of N calls does not: read the
ratio of bests there. Writes ``bench/results/rpc-torch-<version>-<mode>.json`` and renders
``rpc.md`` from every such file: one table per torch version (and mode) measured, each naming
the commit it measured (``--unpinned``: ``rpc_unpinned.*``). ``--smoke``: two payloads, a few
calls, no ipyparallel, results to a temporary directory.
Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402
from _plain_world import Plain  # noqa: E402
from _rpc_loops import (  # noqa: E402
    KINDS,
    LARGE,
    LARGE_KINDS,
    PAYLOADS,
    copy_floor,
    measure,
    measure_large,
    tensor,
)

import nbdist  # noqa: E402
from nbdist.patches import thread_states  # noqa: E402

__all__ = ["NbBox", "main", "nb_echo", "nb_held", "nb_nbytes_of"]


# Defined here, in __main__, like a notebook cell's function and class: nbdist ships them by
# value (the code once per destination, then by digest).
def nb_echo(x: Any) -> Any:
    """Return ``x``."""
    return x


_NB_HELD: dict = {}


def nb_nbytes_of(x: Any) -> int:
    """A tensor's size: what a call that only sends ``x`` gets back."""
    return x.nbytes


def nb_held(nbytes: int) -> Any:
    """The same tensor of ``nbytes`` bytes on every call (the worker's own ``_NB_HELD``)."""
    t = _NB_HELD.get(nbytes)
    if t is None:
        t = _NB_HELD[nbytes] = torch.ones(max(nbytes // 4, 1))
    return t


class NbBox:
    """An object to hold in an RRef and call through a proxy."""

    def echo(self, x: Any) -> Any:
        """Return ``x``."""
        return x


def _plan(quick: bool | str) -> dict[str, tuple[int, int]]:
    """payload -> (calls per block, async window); ``quick`` may be ``"smoke"``."""
    if quick == "smoke":
        return {"16 B": (4, 2), "1 MB": (2, 2)}
    if quick:
        return {"16 B": (300, 16), "64 KB": (150, 16), "1 MB": (40, 8), "16 MB": (6, 2),
                "64 MB": (2, 2)}
    return {"16 B": (1500, 32), "64 KB": (600, 16), "1 MB": (150, 8), "16 MB": (20, 4),
            "64 MB": (6, 2)}


def _stats(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
    return {"median_us": statistics.median(xs) * 1e6, "p10_us": q[0] * 1e6,
            "p90_us": q[-1] * 1e6, "best_us": min(xs) * 1e6, "n": len(xs)}


def rpc_rounds(quick: bool | str, rounds: int) -> dict:
    """plain vs nbdist, every kind and payload, ``rounds`` interleaved rounds."""
    plan = _plan(quick)
    samples: dict[tuple[str, str, str], list[float]] = {}
    torch.set_num_threads(1)  # as the plain torch processes do
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-rpc-") as tmp:
        plain = Plain(tmp)
        c = nbdist.start(1, threads=1, quiet=True)
        try:
            w = c.names[1] if hasattr(c, "names") else "worker1"
            box = rpc.remote(w, NbBox)
            xs = {p: tensor(PAYLOADS[p]) for p in plan}
            for p, (n, window) in plan.items():  # warm-up, not counted
                for kind in KINDS:
                    plain.measure(kind, PAYLOADS[p], max(n // 10, 2), window)
                    measure(kind, w, nb_echo, box, xs[p], max(n // 10, 2), window)
            for r in range(rounds):
                for p, (n, window) in plan.items():
                    for kind in KINDS:
                        sides = ("plain", "nbdist") if (r + len(samples)) % 2 else \
                            ("nbdist", "plain")
                        for side in sides:
                            if side == "plain":
                                lat = plain.measure(kind, PAYLOADS[p], n, window)
                            else:
                                lat = measure(kind, w, nb_echo, box, xs[p], n, window)
                            samples.setdefault((side, kind, p), []).extend(lat)
                print(f"round {r + 1}/{rounds} done (load {os.getloadavg()[0]:.1f})",
                      flush=True)
            del box
        finally:
            c.stop()
            plain.stop()
    out: dict[str, Any] = {}
    for (side, kind, p), lat in samples.items():
        out.setdefault(kind, {}).setdefault(p, {})[side] = _stats(lat)
    for kind in out:
        for d in out[kind].values():
            if "plain" in d and "nbdist" in d:
                d["ratio"] = d["nbdist"]["median_us"] / d["plain"]["median_us"]
                d["ratio_best"] = d["nbdist"]["best_us"] / d["plain"]["best_us"]
    return out


def _large_plan(quick: bool | str) -> dict[str, tuple[int, int]]:
    """payload -> (bytes, calls per block) of the large-tensor table."""
    if quick == "smoke":
        return {"2 MB": (2 << 20, 2)}
    calls = {"16 MB": 12, "64 MB": 6, "256 MB": 3} if not quick else \
        {"16 MB": 6, "64 MB": 3, "256 MB": 2}
    return {p: (LARGE[p], calls[p]) for p in LARGE}


def large_rounds(quick: bool | str, rounds: int) -> dict:
    """Large tensors: plain torch vs nbdist (its shared-memory path on) vs the copy floor,
    interleaved; per payload and kind, seconds per call."""
    plan = _large_plan(quick)
    samples: dict[tuple[str, str, str], list[float]] = {}
    torch.set_num_threads(1)
    fns = (nb_echo, nb_nbytes_of, nb_held)
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-large-") as tmp:
        plain = Plain(tmp)
        c = nbdist.start(1, threads=1, quiet=True)
        try:
            w = "worker1"
            xs = {p: tensor(nb) for p, (nb, _) in plan.items()}
            for p, (nb, _) in plan.items():  # warm-up: arenas carved, results cached
                for kind in LARGE_KINDS:
                    plain.measure_large(kind, nb, 2)
                    measure_large(kind, w, fns, xs[p], 2)
            for r in range(rounds):
                for p, (nb, n) in plan.items():
                    for kind in LARGE_KINDS:
                        sides = ["plain", "nbdist", "floor"]
                        if r % 2:
                            sides.reverse()
                        for side in sides:
                            if side == "plain":
                                lat = plain.measure_large(kind, nb, n)
                            elif side == "nbdist":
                                lat = measure_large(kind, w, fns, xs[p], n)
                            else:
                                lat = copy_floor(xs[p], 2 if kind == "echo" else 1, n)
                            samples.setdefault((kind, p, side), []).extend(lat)
                print(f"large round {r + 1}/{rounds} done (load {os.getloadavg()[0]:.1f})",
                      flush=True)
        finally:
            c.stop()
            plain.stop()
    out: dict[str, Any] = {}
    for (kind, p, side), lat in samples.items():
        moved = plan[p][0] * (2 if kind == "echo" else 1)
        st = _stats(lat)
        st["gbps_best"] = moved / (st["best_us"] * 1e-6) / 1e9
        st["gbps_median"] = moved / (st["median_us"] * 1e-6) / 1e9
        out.setdefault(kind, {}).setdefault(p, {})[side] = st
    return out


def render_large(large: dict, heading: str = "##", large_run: str = "",
                 load: float | None = None) -> list[str]:
    """The large-tensor table: GB/s best and median, nbdist against plain and the floor."""
    lines = [f"{heading} Large tensors (shared-memory path, `nbdist/shm/transport.py`)", "",
             "GB/s (bytes moved per second; an echo counts both directions), best of N "
             "calls and median. Copy floor: the same bytes copied with `Tensor.copy_` into "
             "memory allocated beforehand, in one process (twice for an echo), same run. "
             "`argument`: the tensor is sent and its size returned; `result`: the callee "
             "returns a tensor it holds." + (f" This table: {large_run}." if large_run else "")
             + (f" 1-min load average {load} at its end (2 cores)." if load else ""), "",
             "| call | size | plain torch best / median | nbdist best / median | "
             "copy floor best / median | nbdist / plain (best) | nbdist / floor (best) |",
             "|---|---|---|---|---|---|---|"]
    for kind in LARGE_KINDS:
        for p, d in large.get(kind, {}).items():
            a, b, f = d["plain"], d["nbdist"], d["floor"]
            lines.append(
                f"| {kind} | {p} | {a['gbps_best']:.2f} / {a['gbps_median']:.2f} | "
                f"{b['gbps_best']:.2f} / {b['gbps_median']:.2f} | "
                f"{f['gbps_best']:.2f} / {f['gbps_median']:.2f} | "
                f"**{b['gbps_best'] / a['gbps_best']:.2f}×** | "
                f"{100 * b['gbps_best'] / f['gbps_best']:.0f} % |")
    return lines + [""]


def ipp_rounds(quick: bool | str) -> dict:
    """ipyparallel, one engine on loopback: apply_sync(echo, x) and push + pull of x."""
    import ipyparallel as ipp

    plan = _plan(quick)
    cluster = ipp.Cluster(n=1, controller_ip="127.0.0.1", log_level=40)
    rc = None
    out: dict[str, Any] = {}
    try:
        rc = cluster.start_and_connect_sync()
        view = rc[:]
        view.block = True
        view.execute("import torch")
        e = rc[0]
        e.block = True
        for p, (n, _) in plan.items():
            x = tensor(PAYLOADS[p])
            n = max(n // 5, 2)  # ipyparallel is ~10x slower per call
            e.apply_sync(nb_echo, x)  # warm-up
            apply, pushpull = [], []
            for _ in range(n):
                t = time.perf_counter()
                e.apply_sync(nb_echo, x)
                apply.append(time.perf_counter() - t)
                t = time.perf_counter()
                e.push({"x": x})
                e.pull("x")
                pushpull.append(time.perf_counter() - t)
            out[p] = {"apply_sync": _stats(apply), "push_pull": _stats(pushpull)}
    finally:
        try:
            if rc is not None:
                rc.close()
        finally:
            cluster.stop_cluster_sync()
    return out


def _fmt_us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def render(res: dict, heading: str = "#") -> str:
    """One run's tables (``heading``: the markdown level of its title)."""
    lines = [f"{heading} torch {res['torch']}, {res['mode']} mode ({res['when']})", "",
             f"{res['machine']}; torch {res['torch']}; nbdist at {res.get('commit', '?')}; "
             f"mode {res['mode']}, {res['rounds']} interleaved rounds"
             + (f"; 1-min load average {res['load_1min']} at the end (2 cores: above 2, "
                "other jobs shared the machine and large-payload figures are mostly noise)"
                if "load_1min" in res else "")
             + ". Rank 0 calls one worker; an echo of a "
             "float32 tensor (there and back). nbdist: the function and class defined in "
             "`__main__` (as in a notebook), tracing and output routing on. Plain torch: "
             "two processes, the function imported by reference. Absolute times are noisy "
             "on a shared 2-core machine: read the ratios (same run, interleaved).", "",
             "nbdist keeps torch's RPC threads' Python thread states between calls "
             "(`nbdist/patches/thread_states.py`)" + ("." if res.get("thread_states_kept", True)
                                                      else ": **not in this run** "
                                                      "(`--unpinned`, the cost before)."), "",
             "| call | payload | plain torch median (p10-p90) | nbdist median (p10-p90) | "
             "nbdist / plain | best of N: plain, nbdist (N) | nbdist / plain, best |",
             "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        for p in PAYLOADS:
            d = res["rpc"].get(kind, {}).get(p)
            if not d or "ratio" not in d:
                continue
            a, b = d["plain"], d["nbdist"]
            best = (f"{_fmt_us(a['best_us'])}, {_fmt_us(b['best_us'])} ({b['n']}) | "
                    f"**{d['ratio_best']:.2f}×**") if "ratio_best" in d else "- | -"
            lines.append(f"| `{kind}` | {p} | {_fmt_us(a['median_us'])} "
                         f"({_fmt_us(a['p10_us'])}-{_fmt_us(a['p90_us'])}) | "
                         f"{_fmt_us(b['median_us'])} ({_fmt_us(b['p10_us'])}-"
                         f"{_fmt_us(b['p90_us'])}) | **{d['ratio']:.2f}×** | {best} |")
    lines += ["", "`rpc_async` is time per call of pipelined windows; `remote` is "
              "`rpc.remote(...).to_here()`; `proxy` is `rref.rpc_sync().echo(x)` on an object "
              "held in an RRef.", ""]
    ipp_res = res.get("ipyparallel")
    if ipp_res:
        lines += [f"{heading}# ipyparallel (one engine, loopback), same tensors", "",
                  "| payload | `apply_sync(echo, x)` | / plain `rpc_sync` | "
                  "`push` + `pull` | / plain `rpc_sync` |", "|---|---|---|---|---|"]
        for p, d in ipp_res.items():
            base = res["rpc"].get("rpc_sync", {}).get(p, {}).get("plain", {}).get("median_us")
            a, pp = d["apply_sync"]["median_us"], d["push_pull"]["median_us"]
            ra = f"{a / base:.1f}×" if base else "-"
            rp = f"{pp / base:.1f}×" if base else "-"
            lines.append(f"| {p} | {_fmt_us(a)} | {ra} | {_fmt_us(pp)} | {rp} |")
    elif res.get("ipyparallel_error"):
        lines += ["", f"ipyparallel: not measured ({res['ipyparallel_error']})"]
    if res.get("large"):
        lines += [""] + render_large(res["large"], heading + "#", res.get("large_run", ""),
                                     res.get("large_load"))
    return "\n".join(lines) + "\n"


def _version_key(path: Path) -> tuple:
    version = path.stem.removeprefix("rpc-torch-").rsplit("-", 1)[0]
    return tuple(int(x) if x.isdigit() else 0 for x in version.split(".")), path.stem


def render_all(results: Path = _common.RESULTS) -> str:
    """``rpc.md``: one section per torch version (and mode) that has a result file."""
    runs = sorted(results.glob("rpc-torch-*.json"), key=_version_key)
    lines = ["# RPC: nbdist vs plain torch vs ipyparallel, per torch version", "",
             "One section per `bench/rpc/rpc.py` run kept in `bench/results/rpc-torch-*.json` "
             "(`python bench/rpc/rpc.py [--quick]` in a venv with that torch: "
             "`make bench TORCH=2.14.1` or `.venv-torch-2.14.1/bin/python bench/rpc/rpc.py`). "
             "Each run compares nbdist with plain torch of the same version, interleaved. "
             "For 16 MB and 64 MB read the best-of-N column: their medians swing "
             "0.6-1.8x from run to run on this machine, on every version.", ""]
    for path in runs:
        lines.append(render(json.loads(path.read_text()), heading="##"))
    return "\n".join(lines)


def _large_only(args: argparse.Namespace, out: Path, quick: bool | str, rounds: int) -> int:
    """``--large-only``: measure the large-tensor table into this torch's full-run file."""
    version = torch.__version__.split("+")[0]
    path = out / f"rpc-torch-{version}-full.json"
    res = json.loads(path.read_text()) if path.exists() else {
        "when": "-", "commit": "-", "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__, "mode": "full", "rounds": 0, "rpc": {}}
    res["large"] = large_rounds(quick, rounds)
    res["large_load"] = round(os.getloadavg()[0], 1)
    res["large_run"] = (f"measured {datetime.datetime.now().isoformat(timespec='seconds')} "
                        f"at {_common.measured_commit()}, {rounds} interleaved rounds")
    path.write_text(json.dumps(res, indent=1))
    (out / "rpc.md").write_text(render_all(out))
    print("\n".join(render_large(res["large"])))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="few calls: under 2 minutes")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--no-ipp", action="store_true", help="skip ipyparallel")
    ap.add_argument("--no-large", action="store_true", help="skip the large-tensor table")
    ap.add_argument("--large-only", action="store_true",
                    help="only the large-tensor table (kept beside the last full run's)")
    ap.add_argument("--unpinned", action="store_true",
                    help="nbdist without keeping torch's RPC thread states (the cost before)")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    quick: bool | str = "smoke" if args.smoke else args.quick
    rounds = args.rounds or (1 if args.smoke else 2 if args.quick else 5)
    if args.unpinned:
        os.environ[thread_states.ENV] = "0"
    out = _common.out_dir(args)
    t0 = time.monotonic()
    if args.large_only:
        return _large_only(args, out, quick, rounds)
    res: dict[str, Any] = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": _common.measured_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
        "rounds": rounds, "thread_states_kept": not args.unpinned,
    }
    res["rpc"] = rpc_rounds(quick, rounds)
    if not (args.no_large or args.unpinned):
        res["large"] = large_rounds(quick, max(rounds - 2, 1) if not args.smoke else 1)
        res["large_load"] = round(os.getloadavg()[0], 1)
    res["load_1min"] = round(os.getloadavg()[0], 1)  # 2 cores: above ~2, others ran too
    if not (args.no_ipp or args.smoke):  # ipyparallel's start alone takes longer than a smoke
        try:
            res["ipyparallel"] = ipp_rounds(quick)
        except Exception as exc:  # noqa: BLE001 - the RPC figures still count
            res["ipyparallel_error"] = repr(exc)
    res["seconds"] = round(time.monotonic() - t0, 1)
    if args.unpinned:
        (out / "rpc_unpinned.json").write_text(json.dumps(res, indent=1))
        text = render(res)
        (out / "rpc_unpinned.md").write_text(text)
    else:
        version = torch.__version__.split("+")[0]
        (out / f"rpc-torch-{version}-{res['mode']}.json").write_text(json.dumps(res, indent=1))
        text = render(res)
        (out / "rpc.md").write_text(render_all(out))
    print(text)
    print(f"{res['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
