"""A world across hosts vs a local one: time to ready and RPC round trips.

``python bench/hosts/multihost.py [--rounds N]`` (part of ``make bench``; needs root for network
namespaces, else it says why and writes nothing). Hosts are faked as in the tests
(``tests/fakehosts.py``): network namespaces on a bridge, launcher ``ip netns exec``, so the
"network" is a veth pair and a bridge in one kernel: the figures show nbdist's own costs on
top of TCP, not a real network's latency.

Measured in one run, the same world size (rank 0 + 4 workers) both ways:

- **start, cold**: local = first world (template prewarmed by an earlier world, as in a
  notebook); hosts = the join agents launched too (each imports torch on its host).
- **start, warm** (restart with everything running): local template / agents kept.
- **rpc_sync round trip**, 16 B and 1 MB float32 tensors echoed, from rank 0 to a local
  worker and to a rank on another (fake) host; median, p10, p90 of ``--rounds`` calls.
- **a trivial cell** on every rank of the host world, through the join agents' relay
  (one frame per host) and with ``NBDIST_RELAY=0`` (one per rank): the frames and bytes the
  notebook sent (``c.frames.last_cell``) and the median time of ``--rounds // 10`` cells.

Writes ``bench/results/multihost.json`` and ``multihost.md``, naming the commit measured.
``--smoke``: one rank per host, a few calls, results to a temporary directory.
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
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from fakehosts import FakeHosts, can_make_namespaces  # noqa: E402

sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

import nbdist  # noqa: E402

__all__ = ["main"]


def echo(x: Any) -> Any:
    return x


def _rtt(dest: str, payload: Any, rounds: int) -> dict:
    import torch.distributed.rpc as rpc

    for _ in range(min(rounds, 20)):
        rpc.rpc_sync(dest, echo, args=(payload,))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        rpc.rpc_sync(dest, echo, args=(payload,))
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10],
            "p90_ms": times[len(times) * 9 // 10]}


def _cells(c: Any, rounds: int) -> dict:
    """A trivial cell on every rank, relayed and not: frames, bytes, median time."""
    found = {}
    for label, relay in (("relay", "1"), ("direct", "0")):
        os.environ["NBDIST_RELAY"] = relay
        try:
            times = []
            for _ in range(max(rounds, 3)):
                t0 = time.perf_counter()
                c.run("1", show=False)
                times.append((time.perf_counter() - t0) * 1e3)
            sent = c.frames.last_cell
            found[label] = {"frames": sent.frames, "bytes": sent.bytes,
                            "median_ms": statistics.median(times)}
        finally:
            os.environ.pop("NBDIST_RELAY", None)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    why = can_make_namespaces()
    if why is not None:
        print(f"bench/hosts/multihost.py skipped: fake hosts need network namespaces ({why})")
        return 0
    import torch

    per_host = 1 if args.smoke else 2
    rounds = 5 if args.smoke else args.rounds
    out = _common.out_dir(args)
    payloads = {"16 B": torch.zeros(4), "1 MB": torch.zeros(256 * 1024)}
    res: dict = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                 "commit": _common.measured_commit(),
                 "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
                 "torch": torch.__version__, "rounds": rounds, "start_s": {}, "rtt": {}}
    nbdist.start(1, quiet=True).stop()  # the template warm, as a notebook's first world finds it
    fh = FakeHosts(["a", "b"])
    try:
        hosts = {fh.ns["a"]: per_host, fh.ns["b"]: per_host}
        for label, kw in (("local", {"n": 2 * per_host}),
                          ("hosts", {"n": 0, "hosts": hosts, "iface": fh.address,
                                     "launcher": fh.launcher})):
            t0 = time.perf_counter()
            c = nbdist.start(quiet=True, **kw)
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            c = c.restart(quiet=True)
            warm = time.perf_counter() - t0
            res["start_s"][label] = {"cold": cold, "warm": warm}
            for pname, payload in payloads.items():
                res["rtt"][f"{label} {pname}"] = _rtt(c.names[1], payload, rounds)
            if label == "hosts":
                res["cell"] = _cells(c, rounds // 10)
            c.stop()
    finally:
        nbdist.stop()
        nbdist.release_hosts()
        fh.close()
    (out / "multihost.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# Across (fake) hosts vs local — {res['when']}, {res['machine']}, "
             f"torch {res['torch']}, nbdist at {res['commit']}", "",
             f"| world (rank 0 + {2 * per_host}) | start cold s | start warm (restart) s |",
             "|---|---|---|"]
    for label, t in res["start_s"].items():
        lines.append(f"| {label} | {t['cold']:.2f} | {t['warm']:.2f} |")
    lines += ["", f"rpc_sync echo from rank 0, {rounds} calls:", "",
              "| to | median ms | p10 ms | p90 ms |", "|---|---|---|---|"]
    for label, r in res["rtt"].items():
        lines.append(f"| {label} | {r['median_ms']:.3f} | {r['p10_ms']:.3f} | "
                     f"{r['p90_ms']:.3f} |")
    ranks = 2 * per_host
    lines += ["", f"a trivial cell on the host world's {ranks} ranks (2 hosts), frames the "
              "notebook sent:", "", "| path | frames | bytes | median ms |", "|---|---|---|---|"]
    for label, r in res["cell"].items():
        lines.append(f"| {label} | {r['frames']} | {r['bytes']} | {r['median_ms']:.1f} |")
    (out / "multihost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
