"""``--ray`` on the Ray test bed beside Ray's own way to run torch, ``TorchTrainer``.

``python bench/hosts/ray.py [--rounds N]`` (part of ``make bench``; needs the Ray test bed
``tests/raybed.py``: root and ray, else it says why and writes nothing). One run on a real Ray
2.60 cluster, the head on this machine (where the notebook's driver runs) and 2 worker nodes
of 2 CPUs each in network namespaces, 4 remote ranks each way, ``--rounds`` times interleaved:

- **nbdist**: ``nbdist.start(0, ray="--nodes 2 --ranks-per-node 2 --cpus 2")`` to every one of
  the 4 remote ranks answering an RPC (start returns only then): the driver's connection
  (``ray.init``, measured apart too), the placement group, a join agent per bundle as a Ray
  actor, ranks with torch imported; then ``restart()`` in the same group,
  ``restart(keep=True)``, and one trivial cell (``c.run("1", show=False)``, median of
  ``CELLS``); then ``stop()`` and ``release_hosts()``.
- **Ray Train**: ``ray.init`` (timed apart), then ``TorchTrainer`` with
  ``ScalingConfig(num_workers=4, resources_per_worker={"CPU": 1})``: from the ``fit()`` call to
  the last of the 4 workers on the first line of ``train_loop_per_worker`` with
  ``torch.distributed`` initialised (each worker writes its ``time.time()`` to a file: the
  nodes share this machine's clock and disk), and the whole ``fit()``. TorchTrainer has no warm
  restart: "restart" is a second ``fit()`` (new worker processes, torch imported again), and
  "one trivial cell" is a ``fit()`` whose loop only runs a barrier. Its ``RunConfig`` storage is
  a temporary directory, deleted after; its ranks get ``GLOO_SOCKET_IFNAME=eth0`` (the bed's
  hostnames resolve nowhere); the detached actors a ``fit()`` leaves (``DETACHED``) are killed
  after each round. Ray Train's controller log gives where a ``fit()``'s time goes.
- **SLURM**, not run here: the medians of ``bench/results/slurm.json`` (its own run, on the
  SLURM test bed), named with its date and commit.

``ray`` and ``ray.train.torch`` are imported before any timing (the figures say how long that
took, once per process). Each peer ends with the driver disconnected and Ray listing no live
actor and no placement group (waited for, not timed). Writes ``bench/results/ray.json`` and
``ray.md``, naming the commit measured. ``--smoke``: one round, fewer cells, one ``fit()``,
results to a temporary directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# not this directory: this file's name would hide the ray package (``python bench/hosts/ray.py``
# puts it first); Ray's workers get the driver's sys.path too
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != HERE]
sys.path.insert(0, str(HERE.parents[1] / "tests"))
from raybed import ROOT, RayBed, cannot_run, leftovers  # noqa: E402

sys.path.insert(0, str(HERE.parent))  # bench/'s helpers
import _common  # noqa: E402

import nbdist  # noqa: E402

__all__ = ["main"]

NODES, CPUS = 2, 2
OPTIONS = f"--nodes {NODES} --ranks-per-node 2 --cpus {CPUS}"
WORKERS = 4
CELLS = 20  # trivial cells per nbdist round (3 with --smoke)
START_TIMEOUT = 120.0  # nbdist's --start-timeout here (60 s by default): 2 busy cores
GONE = 60.0  # seconds for Ray to list no actor and no placement group of a peer
FIT_TIMEOUT = 300.0  # seconds one TorchTrainer.fit() may take before the round fails
SLURM_JSON = _common.RESULTS / "slurm.json"
#: Gloo finds a rank's address from its hostname; the bed's nodes' (nbrayK) resolve nowhere,
#: so it falls back to 127.0.0.1 and the ranks time out: TorchTrainer's ranks are told their
#: interface, as on any cluster whose hostnames do not resolve (nbdist gives its ranks their
#: address itself)
RUNTIME_ENV = {"env_vars": {"GLOO_SOCKET_IFNAME": "eth0"}}
#: (name, namespace) of the detached actors a TorchTrainer.fit() leaves on the cluster
DETACHED = [("AutoscalingCoordinator", "AutoscalingCoordinator"),
            ("train_v2_state_actor", "_train_state_actor")]
#: Ray Train's controller log (one file per fit; the controller runs on the driver's node)
TRAIN_LOGS = ROOT / "head" / "session_latest" / "logs" / "train"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PHASE = re.compile(r"\[Worker Group Initialization\] (.+?) in ([0-9.]+)s")


def _nothing_left(address: str, timeout: float = GONE) -> None:
    """Wait until Ray lists no live actor and no placement group; RuntimeError after
    ``timeout`` naming what stayed."""
    deadline = time.monotonic() + timeout
    while True:
        actors, groups = leftovers(address)
        if not actors and not groups:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"after {timeout:g}s Ray still lists actors "
                               f"{[a['class'] for a in actors]} and placement groups "
                               f"{[g['name'] for g in groups]}")
        time.sleep(0.5)


def _disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _timed_init(into: list[float]) -> Callable[[], None]:
    """Wrap ``ray.init`` so that each call's seconds go to ``into``; returns the undo."""
    import ray

    real = ray.init

    def init(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - t0)

    ray.init = init

    def undo() -> None:
        ray.init = real

    return undo


def _nbdist(address: str, cells: int) -> dict:
    inits: list[float] = []
    undo = _timed_init(inits)
    try:
        t0 = time.perf_counter()
        c = nbdist.start(0, ray=OPTIONS, start_timeout=START_TIMEOUT, quiet=True)
        start = time.perf_counter() - t0
    finally:
        undo()
    try:
        t0 = time.perf_counter()
        c = c.restart(quiet=True)
        restart = time.perf_counter() - t0
        t0 = time.perf_counter()
        c = c.restart(keep=True, quiet=True)
        keep = time.perf_counter() - t0
        times = []
        for _ in range(cells):
            t0 = time.perf_counter()
            c.run("1", show=False, timeout=60)
            times.append(time.perf_counter() - t0)
    finally:
        nbdist.stop()
        nbdist.release_hosts()
        _disconnect()  # nbdist's own release disconnects too; this for a failed start
    _nothing_left(address)
    return {"start": start, "ray_init": inits[0] if inits else None, "restart": restart,
            "keep_restart": keep, "cell": statistics.median(times), "cells": times}


def _train_loop(config: dict) -> None:
    """``train_loop_per_worker``: when this worker got here, in a file of its rank."""
    import time

    t = time.time()
    import json
    from pathlib import Path

    import ray.train
    import torch.distributed as dist

    ready = dist.is_initialized()
    world = dist.get_world_size() if ready else 0
    if config["barrier"]:
        dist.barrier()
    rank = ray.train.get_context().get_world_rank()
    Path(config["dir"], f"{rank}.json").write_text(json.dumps(
        {"t": t, "initialized": ready, "world": world, "backend": dist.get_backend()
         if ready else None}))


def _fit(storage: Path, name: str, barrier: bool) -> dict:
    """One ``TorchTrainer.fit()``: its seconds, and the seconds from the call to the last of
    the workers on its loop's first line."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    marks = storage / f"{name}-marks"
    marks.mkdir()
    trainer = TorchTrainer(
        _train_loop, train_loop_config={"dir": str(marks), "barrier": barrier},
        scaling_config=ScalingConfig(num_workers=WORKERS, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(storage / "runs")))
    box: dict = {}

    def fit() -> None:
        try:
            box["result"] = trainer.fit()
        except BaseException as exc:  # noqa: BLE001 - told below
            box["error"] = exc

    wall = time.time()
    t0 = time.perf_counter()
    runner = threading.Thread(target=fit, daemon=True, name="bench-fit")
    runner.start()
    runner.join(FIT_TIMEOUT)
    whole = time.perf_counter() - t0
    if runner.is_alive():
        raise TimeoutError(f"TorchTrainer.fit() ({name}) still running after {FIT_TIMEOUT:g}s")
    if "error" in box:
        raise box["error"]
    got = [json.loads(f.read_text()) for f in sorted(marks.glob("*.json"))]
    if len(got) != WORKERS or not all(g["initialized"] and g["world"] == WORKERS for g in got):
        raise RuntimeError(f"TorchTrainer ({name}): {len(got)} workers reported, {got}")
    return {"fit": whole, "to_loop": max(g["t"] for g in got) - wall,
            "backend": got[0]["backend"]}


def _kill_detached() -> list[str]:
    """Kill the detached actors Ray Train leaves on the cluster (they outlive the driver's
    job); returns the names of those there were."""
    import ray

    killed = []
    for name, namespace in DETACHED:
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            continue
        ray.kill(actor, no_restart=True)
        killed.append(name)
    return killed


def _ray_train(address: str, storage: Path, round_: int, seen: set[Path],
               smoke: bool = False) -> dict:
    """One round of Ray Train: ``ray.init``, a first ``fit()``, a second, and one of a barrier
    (``smoke``: the first only, ~40 s each on 2 cores; the others' columns read "—")."""
    import ray

    here = storage / f"round{round_}"
    here.mkdir()
    left: list[str] = []
    _phases(seen)  # those of an earlier round that failed
    try:
        t0 = time.perf_counter()
        ray.init(log_to_driver=False, logging_level=logging.ERROR, runtime_env=RUNTIME_ENV)
        init = time.perf_counter() - t0
        first = _fit(here, "first", barrier=False)
        second = None if smoke else _fit(here, "second", barrier=False)
        cell = None if smoke else _fit(here, "cell", barrier=True)
        made = [f for f in (first, second, cell) if f is not None]
        for fit, phases in zip(made, _phases(seen), strict=False):
            fit["phases"] = phases
    finally:
        if ray.is_initialized():
            left = _kill_detached()
        _disconnect()
        shutil.rmtree(here, ignore_errors=True)
    _nothing_left(address)
    return {"ray_init": init, "first": first, "second": second, "cell": cell,
            "detached_left": left}


def _phases(seen: set[Path]) -> list[dict[str, float]]:
    """Ray Train's own timings of the fits since the last call (best effort: its controller
    log's "[Worker Group Initialization] ... in N s" lines), a dict per fit, oldest first."""
    out = []
    files = sorted(set(TRAIN_LOGS.glob("ray-train-sys-controller-*.log")) - seen,
                   key=lambda f: f.stat().st_mtime)
    for f in files:
        seen.add(f)
        phases = {}
        for line in f.read_text(errors="replace").splitlines():
            try:
                message = json.loads(line).get("message", "")
            except ValueError:
                continue
            m = _PHASE.search(message)
            if m:
                phases[m.group(1)] = float(m.group(2))
        out.append(phases)
    return out


def _fits(rounds: list[dict], which: str, text: str) -> str:
    """``text`` with the medians of the rounds' ``which`` fit (``—``: none made, --smoke)."""
    made = [r[which] for r in rounds if r[which] is not None]
    if not made:
        return "—"
    return text.format(to_loop=_median([f["to_loop"] for f in made]),
                       fit=_median([f["fit"] for f in made]))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _slurm() -> dict | None:
    """The nbdist --slurm medians of ``bench/results/slurm.json``, with its date and commit."""
    try:
        data = json.loads(SLURM_JSON.read_text())
    except (OSError, ValueError):
        return None
    nb = data.get("runs", {}).get("nbdist") or []
    if not nb:
        return None
    return {"when": data.get("when"), "commit": data.get("commit"),
            "machine": data.get("machine"), "torch": data.get("torch"),
            "options": data.get("options"), "rounds": len(nb),
            "start": _median([r["start"] for r in nb]),
            "restart": _median([r["restart"] for r in nb]),
            "keep_restart": _median([r["keep_restart"] for r in nb])}


def _table(res: dict) -> list[str]:
    rounds, train = res["rounds"], res["import_ray_train"]
    lines = [f"# From a notebook to 4 ranks with torch on 2 Ray nodes — {res['when']}, "
             f"{res['machine']}, torch {res['torch']}, ray {res['ray']}, nbdist at "
             f"{res['commit']}", "",
             f"The Ray test bed (`tests/raybed.py`: a real Ray {res['ray']} cluster, the head on "
             f"this machine where the notebook's driver runs, {NODES} worker nodes of {CPUS} "
             "CPUs that are network namespaces of it), median of "
             f"{rounds} interleaved round(s), seconds. `ray` was imported before timing "
             f"({res['import_ray']:.2f} s, once a process; `ray.train.torch` "
             f"{'not installed' if train is None else format(train, '.2f') + ' s more'}); "
             "the ready column includes the driver's `ray.init`, shown apart too.", "",
             "| how | `ray.init` | ready: 4 ranks with torch | restart | keep-restart | "
             "one trivial cell |", "|---|---|---|---|---|---|"]
    nb = res["runs"]["nbdist"]
    if nb:
        inits = [r["ray_init"] for r in nb if r["ray_init"] is not None]
        lines.append(f"| nbdist `--ray \"{OPTIONS}\"` | {_median(inits):.2f} (in start) | "
                     f"{_median([r['start'] for r in nb]):.2f} | "
                     f"{_median([r['restart'] for r in nb]):.2f} | "
                     f"{_median([r['keep_restart'] for r in nb]):.2f} | "
                     f"{_median([r['cell'] for r in nb]):.3f} (median of "
                     f"{len(nb[0]['cells'])} a round) |")
    rt = res["runs"]["ray-train"]
    if rt:
        init = _median([r["ray_init"] for r in rt])
        ready = _median([r["ray_init"] + r["first"]["to_loop"] for r in rt])
        whole = _median([r["ray_init"] + r["first"]["fit"] for r in rt])
        lines.append(
            f"| Ray Train `TorchTrainer(num_workers=4)`, {rt[0]['first']['backend']} | "
            f"{init:.2f} | {ready:.2f} to the loop's first line (whole `fit()` {whole:.2f}) | "
            + _fits(rt, "second", "a second `fit()`: {to_loop:.2f} to the loop (whole {fit:.2f})")
            + f" | no | {_fits(rt, 'cell', 'a `fit()` of a barrier: {fit:.2f}')} |")
    sl = res["slurm"]
    if sl:
        lines.append(f"| nbdist `--slurm \"{sl['options']}\"`, from bench/results/slurm.json "
                     f"(its own run, {sl['when']}, {sl['commit']}; the SLURM test bed) | — | "
                     f"{sl['start']:.2f} | {sl['restart']:.2f} | {sl['keep_restart']:.2f} | "
                     "— |")
    lines += ["", "nbdist's restarts keep the placement group (and the agents in it); "
              "TorchTrainer has no warm restart: each `fit()` starts a controller actor, asks "
              "for a new placement group and starts new worker processes, torch imported "
              "again. Each peer ends with nothing left in Ray (no actor, no placement group), "
              "not timed."]
    if rt:
        first = [r["first"].get("phases", {}) for r in rt]
        created = [p[k] for p in first for k in p if k.endswith("worker actors created")]
        context = [p[k] for p in first if (k := "Train context initialized on workers") in p]
        group = [p[k] for p in first if (k := "Worker group startup completed") in p]
        if created and context and group:
            rest = _median([r["first"]["to_loop"] for r in rt]) - _median(group)
            lines += ["", f"Where a first `fit()`'s time to the loop goes, by Ray Train's "
                      f"controller log (medians): {WORKERS} worker actors created "
                      f"{_median(created):.2f} s, train context on the workers (torch "
                      f"imported, process group) {_median(context):.2f} s, the worker group "
                      f"{_median(group):.2f} s in all; the other {rest:.2f} s start the "
                      "controller actor and its helpers and ask for the resources."]
        left = sorted({n for r in rt for n in r.get("detached_left", [])})
        lines += ["", "TorchTrainer's ranks are given `GLOO_SOCKET_IFNAME=eth0` "
                  "(`ray.init(runtime_env=...)`): Gloo finds a rank's address from its "
                  "hostname, the bed's (nbrayK) resolve nowhere, so it falls back to 127.0.0.1 "
                  "and the ranks time out (nbdist gives its ranks their address itself)."
                  + (f" A `fit()` leaves detached actors on the cluster ({', '.join(left)}), "
                     "outliving the driver; killed after each round, so each round's first "
                     "`fit()` makes them again." if left else "")]
    if sl:
        lines += ["", f"The `--slurm` row is not measured here: {sl['machine']}, torch "
                  f"{sl['torch']}, median of its {sl['rounds']} rounds."]
    lines += ["",
              "Rerun, as root: `.venv/bin/python bench/hosts/ray.py [--rounds N]` (part of "
              "`make bench`; TorchTrainer needs `ray[train]`, in the `bench` extra)."]
    for name, err in res["errors"].items():
        text = [line for line in err.splitlines() if line.strip()]
        lines.append(f"\n{name} failed: {text[0] if text else err}"
                     + (f" ... {text[-1]}" if len(text) > 1 else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    why = cannot_run()
    if why is not None:
        print(f"bench/hosts/ray.py skipped: {why}")
        return 0
    import torch

    rounds = 1 if args.smoke else args.rounds
    cells = 3 if args.smoke else CELLS
    out = _common.out_dir(args)
    t0 = time.perf_counter()
    import ray
    import_ray = time.perf_counter() - t0
    errors: dict[str, str] = {}
    try:
        t0 = time.perf_counter()
        import ray.train.torch  # noqa: F401
        import_train: float | None = time.perf_counter() - t0
    except ImportError as exc:
        import_train = None
        errors["ray-train"] = (f"{exc} (TorchTrainer needs ray[train]: pip install "
                               f"\"ray[train]=={ray.__version__}\")")
    res: dict = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                 "commit": _common.measured_commit(),
                 "machine": f"{platform.machine()}, {os.cpu_count()} cores, load "
                            f"{os.getloadavg()[0]:.1f}",
                 "torch": torch.__version__, "ray": ray.__version__, "rounds": rounds,
                 "options": OPTIONS, "import_ray": import_ray, "import_ray_train": import_train,
                 "runs": {"nbdist": [], "ray-train": []}, "slurm": _slurm(), "errors": errors}
    nbdist.start(1, quiet=True).stop()  # the template warm, as a notebook's first world finds it
    bed = RayBed(nodes=NODES, cpus=CPUS)
    before = {k: os.environ.get(k) for k in bed.env}
    storage = Path(tempfile.mkdtemp(prefix="nbdist-bench-ray-"))
    try:
        bed.up()
        os.environ.update(bed.env)
        res["bed_up_s"] = bed.up_s
        seen: set[Path] = set()
        peers: dict[str, Callable[[int], dict]] = {
            "nbdist": lambda r: _nbdist(bed.address, cells),
            "ray-train": lambda r: _ray_train(bed.address, storage, r, seen, args.smoke)}
        if import_train is None:
            del peers["ray-train"]
        for r in range(rounds):
            for name, run in peers.items():
                try:
                    res["runs"][name].append(run(r))
                except Exception as exc:  # noqa: BLE001 - a peer that fails is reported
                    res["errors"][name] = _ANSI.sub("", f"{type(exc).__name__}: {exc}")
                    nbdist.stop()
                    nbdist.release_hosts()
                    _disconnect()
                    try:
                        _nothing_left(bed.address)
                    except RuntimeError as left:
                        res["errors"][f"{name} cleanup"] = str(left)
    finally:
        nbdist.stop()
        nbdist.release_hosts()
        _disconnect()
        bed.down()
        shutil.rmtree(storage, ignore_errors=True)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    (out / "ray.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = _table(res)
    (out / "ray.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
