"""``--slurm`` on the SLURM test bed beside ipyparallel's and dask-jobqueue's SLURM clusters.

``python bench/hosts/slurm.py [--rounds N]`` (part of ``make bench``; needs the test bed
``../shared/slurm`` and root, else it says why and writes nothing). One run, 2 nodes of 2 CPUs,
4 remote workers each way, ``--rounds`` times interleaved:

- **nbdist**: ``nbdist.start(0, slurm="-N2 --ntasks-per-node=2")`` from outside any allocation
  to every rank answering an RPC (submit, pending, agents that import torch, ranks); then
  ``restart()`` in the same allocation, and ``restart(keep=True)``.
- **ipyparallel**: ``Cluster(engines="slurm", n=4)`` (its own batch job) to 4 engines
  connected, then ``import torch`` on all of them (what nbdist's ready includes).
- **dask-jobqueue**: ``SLURMCluster(cores=2, processes=2).scale(jobs=2)`` to 4 workers, then
  ``import torch`` on all of them.

Each ends with nothing queued (waited for, not timed). Writes ``bench/results/slurm.json`` and
``slurm.md``, naming the commit measured. ``--smoke``: one round, results to a temporary
directory.
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
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from slurmbed import IFACE, SlurmBed, cannot_run, jobs  # noqa: E402

sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

import nbdist  # noqa: E402

__all__ = ["main"]

OPTIONS = "-N2 --ntasks-per-node=2"
ADDRESS = "10.77.13.1"  # this machine on the test bed's bridge (IFACE)


def _drained(timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while jobs() and time.monotonic() < deadline:
        time.sleep(0.2)


def _nbdist() -> dict:
    t0 = time.perf_counter()
    c = nbdist.start(0, slurm=OPTIONS, iface=IFACE, quiet=True)
    start = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = c.restart(quiet=True)
    restart = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = c.restart(keep=True, quiet=True)
    keep = time.perf_counter() - t0
    c.stop()
    nbdist.release_hosts()
    _drained()
    return {"start": start, "restart": restart, "keep_restart": keep}


def _import_torch() -> str:
    import torch
    return torch.__version__


def _time_peer(start: Callable[[], tuple[Callable, Callable]]) -> dict:
    """``start()`` brings a peer's 4 workers up and returns (run a function on all, close);
    timed to ready, then to torch imported on all of them."""
    t0 = time.perf_counter()
    run_all, close = start()
    try:
        ready = time.perf_counter() - t0
        run_all(_import_torch)
        torch_ready = time.perf_counter() - t0
    finally:
        close()
    _drained()
    return {"ready": ready, "ready_torch": torch_ready}


def _ipyparallel() -> tuple[Callable, Callable]:
    import ipyparallel as ipp

    cluster = ipp.Cluster(engines="slurm", n=4, controller_ip=ADDRESS, log_level=40)
    try:
        rc = cluster.start_and_connect_sync()
        rc.wait_for_engines(4, timeout=120)
    except BaseException:
        cluster.stop_cluster_sync()
        raise

    def close() -> None:
        rc.close()
        cluster.stop_cluster_sync()

    return rc[:].apply_sync, close


def _dask() -> tuple[Callable, Callable]:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    cluster = SLURMCluster(cores=2, processes=2, memory="1GB", walltime="00:30:00",
                           scheduler_options={"interface": IFACE},
                           worker_extra_args=["--interface", "eth0"],
                           job_extra_directives=["-o /dev/null", "-e /dev/null"])
    try:
        cluster.scale(jobs=2)
        client = Client(cluster)
        client.wait_for_workers(4, timeout=120)
    except BaseException:
        cluster.close()
        raise

    def close() -> None:
        client.close()
        cluster.close()

    return client.run, close


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    why = cannot_run()
    if why is not None:
        print(f"bench/hosts/slurm.py skipped: {why}")
        return 0
    import torch

    rounds = 1 if args.smoke else args.rounds
    out = _common.out_dir(args)
    res: dict = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                 "commit": _common.measured_commit(),
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores, load "
                            f"{os.getloadavg()[0]:.1f}",
                 "torch": torch.__version__, "rounds": rounds, "options": OPTIONS,
                 "runs": {"nbdist": [], "ipyparallel": [], "dask-jobqueue": []}, "errors": {}}
    nbdist.start(1, quiet=True).stop()  # the template warm, as a notebook's first world finds it
    bed = SlurmBed(nodes=2, task="task/none", gpus=0)
    bed.up()
    here = os.getcwd()
    scratch = tempfile.TemporaryDirectory(prefix="nbdist-bench-slurm-")
    os.chdir(scratch.name)  # ipyparallel writes its batch script to the working directory
    try:
        peers = {"nbdist": _nbdist, "ipyparallel": lambda: _time_peer(_ipyparallel),
                 "dask-jobqueue": lambda: _time_peer(_dask)}
        for _ in range(rounds):
            for name, run in peers.items():
                try:
                    res["runs"][name].append(run())
                except Exception as exc:  # noqa: BLE001 - a peer that fails is reported
                    res["errors"][name] = f"{type(exc).__name__}: {exc}"
                    _drained()
    finally:
        nbdist.stop()
        nbdist.release_hosts()
        bed.down()
        os.chdir(here)
        scratch.cleanup()
    (out / "slurm.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [f"# From a notebook outside any allocation to 4 workers on 2 SLURM nodes — "
             f"{res['when']}, {res['machine']}, torch {res['torch']}, nbdist at "
             f"{res['commit']}", "",
             f"The test bed (`../shared/slurm`, slurm 22.05, nodes are network namespaces of "
             f"this machine), median of {rounds} interleaved round(s), seconds.", "",
             "| how | ready | ready with torch imported | restart in the same job | "
             "keep-restart |", "|---|---|---|---|---|"]
    nb = res["runs"]["nbdist"]
    if nb:
        lines.append(f"| nbdist `--slurm \"{OPTIONS}\"` | — | "
                     f"{_median([r['start'] for r in nb]):.2f} | "
                     f"{_median([r['restart'] for r in nb]):.2f} | "
                     f"{_median([r['keep_restart'] for r in nb]):.2f} |")
    for name, label in (("ipyparallel", "ipyparallel `Cluster(engines=\"slurm\", n=4)`"),
                        ("dask-jobqueue", "dask-jobqueue `SLURMCluster(...).scale(jobs=2)`")):
        runs = res["runs"][name]
        if runs:
            lines.append(f"| {label} | {_median([r['ready'] for r in runs]):.2f} | "
                         f"{_median([r['ready_torch'] for r in runs]):.2f} | "
                         "a new job | no |")
    for name, err in res["errors"].items():
        lines.append(f"\n{name} failed: {err}")
    (out / "slurm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
