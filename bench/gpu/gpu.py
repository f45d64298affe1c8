"""GPU worlds: the batched-RPC tutorial's agent on CUDA, CUDA tensors over RPC, start cost.

``python bench/gpu/gpu.py`` (part of ``make bench``), on a machine with CUDA. This process is
rank 0 and owns the GPU it used before any world started. Three measurements:

1. **Batched vs unbatched**, 10 observers (the tutorial's largest figure), the agent's policy on
   ``cuda:0`` as in the tutorial, and for reference on the CPU; best of ``--repeats`` runs of
   ``--episodes`` x ``--steps`` (``nbdist.tutorials.batching.run_config``).
2. **A 64 MB CUDA tensor round trip** to worker1 and back: with ``--device-maps auto``
   (TensorPipe moves it GPU to GPU) against the same tensor sent through the CPU
   (``.cpu()`` here, ``.to(device)`` there, and back the same way); median of ``--trips``.
3. **Start to ready**, 4 workers, ``--gpus auto`` (each worker makes its CUDA context) vs
   ``--gpus none``.

Writes ``bench/results/gpu.json`` and ``gpu.md`` naming the GPU, the torch and the commit.
``--smoke``: on any machine, seconds: 2 observers, one short episode, a 1 MB tensor; where
there is no CUDA the CUDA parts are skipped and the results say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import nbdist
from nbdist.tutorials import batching

_FAMILY = Path(__file__).resolve().parent
sys.path[:0] = [str(_FAMILY), str(_FAMILY.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

__all__ = ["main", "round_trips", "start_times", "batching_runs"]

#: The tutorial's figure at 10 observers (seconds, GPU agent): batched 23.0, unbatched 62.2.
TUTORIAL_SPEEDUP = 62.2 / 23.0


def echo(t: torch.Tensor) -> torch.Tensor:
    """worker1 returns what it got (with device maps: a tensor on its GPU)."""
    return t


def echo_via_cpu(t: torch.Tensor) -> torch.Tensor:
    """worker1 puts a CPU tensor on its GPU and sends it back through the CPU."""
    return t.to(nbdist.device()).cpu()


def batching_runs(devices: list[str], observers: int, episodes: int, steps: int,
                  repeats: int) -> list[dict]:
    """Best, median of each (device, mode) with ``observers`` observers."""
    rows = []
    c = nbdist.start(observers, name="agent", worker_name="obs{rank}", quiet=True)
    try:
        for device in devices:
            times: dict[str, list[float]] = {m: [] for m in batching.MODES}
            for rep in range(repeats):
                for mode in batching.MODES if rep % 2 == 0 else batching.MODES[::-1]:
                    times[mode].append(batching.run_config(
                        c.names[1:], mode == "batched", episodes, steps, device=device))
            for mode, ts in times.items():
                rows.append({"device": device, "mode": mode, "observers": observers,
                             "best_s": round(min(ts), 3),
                             "median_s": round(statistics.median(ts), 3)})
            best = {r["mode"]: r["best_s"] for r in rows if r["device"] == device}
            print(f"agent on {device}, {observers} observers: batched {best['batched']:.2f}s, "
                  f"unbatched {best['unbatched']:.2f}s, speed-up "
                  f"{best['unbatched'] / best['batched']:.2f}x", flush=True)
    finally:
        c.stop()
    return rows


def round_trips(mb: int, trips: int) -> dict:
    """Median ms of a ``mb`` MB CUDA tensor to worker1 and back, with and without maps."""
    import torch.distributed.rpc as rpc

    t = torch.randn(mb * 2**20 // 4, device="cuda:0")
    out = {"mb": mb, "trips": trips}
    for how in ("device maps", "through the CPU"):
        maps = "auto" if how == "device maps" else None
        c = nbdist.start(1, device_maps=maps, quiet=True)
        try:
            laps = []
            for _ in range(trips + 2):  # two warm-ups
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if maps:
                    back = rpc.rpc_sync("worker1", echo, args=(t,))
                else:
                    back = rpc.rpc_sync("worker1", echo_via_cpu, args=(t.cpu(),)).to("cuda:0")
                torch.cuda.synchronize()
                laps.append(time.perf_counter() - t0)
                assert back.device == t.device and back.shape == t.shape
            ms = statistics.median(laps[2:]) * 1000
            out[how] = {"median_ms": round(ms, 2),
                        "GB_per_s": round(2 * mb / 1024 / (ms / 1000), 2)}
            print(f"{mb} MB CUDA tensor round trip, {how}: {ms:.1f} ms", flush=True)
        finally:
            c.stop()
    return out


def start_times(n: int, repeats: int) -> dict:
    """Best seconds to start ``n`` workers ready for RPC, GPUs on and off."""
    out = {}
    for gpus in ("auto", "none"):
        laps = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            c = nbdist.start(n, gpus=gpus, quiet=True)
            laps.append(time.perf_counter() - t0)
            c.stop()
        out[f"--gpus {gpus}"] = round(min(laps), 3)
        print(f"start {n} workers, --gpus {gpus}: {min(laps):.2f}s", flush=True)
    return out


def _markdown(res: dict) -> str:
    lines = [f"# GPU worlds (bench/gpu/gpu.py)\n\nnbdist at {res['commit']}, torch "
             f"{res['torch']}, {res['gpu']}, {os.cpu_count()} CPU cores.\n"]
    if res.get("note"):
        lines.append(f"{res['note']}\n")
    if res.get("batching"):
        lines.append(f"## Batched vs unbatched, {res['batching'][0]['observers']} observers "
                     f"(best of {res['repeats']})\n\n| agent on | batched s | unbatched s | "
                     "speed-up |\n|---|---|---|---|")
        for dev in dict.fromkeys(r["device"] for r in res["batching"]):
            best = {r["mode"]: r["best_s"] for r in res["batching"] if r["device"] == dev}
            lines.append(f"| {dev} | {best['batched']} | {best['unbatched']} | "
                         f"{best['unbatched'] / best['batched']:.2f}x |")
        lines.append(f"\nThe tutorial's figure at 10 observers: {TUTORIAL_SPEEDUP:.2f}x "
                     "(whole processes timed, 500 steps).\n")
    rt = res.get("round_trip")
    if rt:
        lines.append(f"## {rt['mb']} MB CUDA tensor to worker1 and back (median of "
                     f"{rt['trips']})\n\n| how | ms | GB/s |\n|---|---|---|")
        for how in ("device maps", "through the CPU"):
            lines.append(f"| {how} | {rt[how]['median_ms']} | {rt[how]['GB_per_s']} |")
        lines.append("")
    if res.get("start"):
        lines.append("## Start to ready, 4 workers (best)\n\n| flag | s |\n|---|---|")
        lines += [f"| {k} | {v} |" for k, v in res["start"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--observers", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--trips", type=int, default=20)
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.observers, args.episodes, args.steps, args.repeats = 2, 1, 10, 1
        args.mb, args.trips = 1, 2
    out = _common.out_dir(args)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.ones(1, device="cuda:0")  # the notebook uses its GPU before any world starts
    res: dict = {"commit": _common.measured_commit(), "torch": torch.__version__,
                 "gpu": torch.cuda.get_device_name(0) if cuda else "no GPU",
                 "repeats": args.repeats}
    if not cuda:
        res["note"] = ("No CUDA on this machine: the agent ran on the CPU only; the CUDA "
                       "round trip and the GPU start-up were skipped.")
        print("bench/gpu/gpu.py: " + res["note"], flush=True)
    res["batching"] = batching_runs(["cuda:0", "cpu"] if cuda else ["cpu"], args.observers,
                                    args.episodes, args.steps, args.repeats)
    if cuda:
        res["round_trip"] = round_trips(args.mb, args.trips)
        res["start"] = start_times(4, 1 if args.smoke else 3)
    (out / "gpu.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "gpu.md").write_text(_markdown(res))
    print(f"wrote {out / 'gpu.json'} and gpu.md", flush=True)


if __name__ == "__main__":
    main()
