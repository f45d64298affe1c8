"""What running SPMD code from a notebook costs: FSDP2 in `%%dist --local`, and the DDP
tutorial's `mp.spawn` from a cell, each beside torchrun (and plain `mp.spawn`).

``python bench/cells/spmd.py [--smoke]`` (part of ``make bench``). The same training code (a small
MLP wrapped in ``fully_shard`` over a 1-D CPU mesh, gloo, plain SGD) runs

* **nbdist**: ``%dist_start N --process-group gloo`` in an IPython shell of this process (rank
  0, with torch already imported, as in a notebook), then one ``%%dist --local`` cell;
* **torchrun**: ``python -m torch.distributed.run --standalone --nproc-per-node N+1`` on a
  script holding that same code, written to a temporary directory.

Two figures each, from the same world size:

* **time to first step**: from asking for the world (the magic; torchrun's launch) to the end
  of the first training step on every rank. nbdist's first round in this process starts its
  warm template too (``cold``); later rounds find it up (``warm``), as a notebook's later worlds
  do. torchrun starts every interpreter and imports torch in every rank, every time;
* **step time**: the median of ``--steps`` further steps, timed on rank 0. The code is the same
  and runs in plain processes either way, so this should be equal: a difference is what the
  notebook's world adds to a step.

Beside it, the DDP tutorial's launcher (issue 27): its ``setup``/``cleanup`` (port 12355),
``ToyModel``, ``demo_basic`` (on the CPU) and ``run_demo(demo_basic, N+1)``, which calls
``mp.spawn``. **Time to done**, from the call to the last rank's return:

* **nbdist**: ``run_demo(demo_basic, N+1)`` in a cell of the IPython shell with no world
  running (the spawn starts one: ``start``), then once more in that world (``again``);
* **torchrun**: the same code as a script under ``torchrun --standalone --nproc-per-node
  N+1``, its ``__main__`` calling the tutorial's torchrun variant of ``demo_basic`` (its
  ``elastic_ddp.py``: ``init_process_group("gloo")`` with torchrun's environment);
* **mp.spawn**: that script's ``__main__`` calling ``run_demo(demo_basic, N+1)``, as the
  tutorial runs it (``python script.py``).

The scripts get a free port in place of 12355 (another run on the machine may hold it; the
number changes no timing); nbdist opens none.

The kinds take turns (``--rounds`` times, the order alternating), so that a busy spell of a
shared machine hits both. Writes ``bench/results/spmd.json`` and ``spmd.md`` with the commit
measured, and prints the table. ``--smoke`` runs one round of tiny sizes (under a minute on a
loaded 2-core machine); its figures only show that everything runs: steps of a few
milliseconds on a shared machine swing either way by several times from run to run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402

__all__ = ["main", "summarize_tutorial", "train_code"]

#: The training code both kinds run, after ``init_process_group``. It leaves ``first_done``
#: (wall clock when the first step ended on every rank) and ``step_times`` (seconds) behind.
TRAIN = """
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU())
                        for _ in range(LAYERS)], nn.Linear(WIDTH, 8))
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for block in model:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 8)


def train_step():
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()


train_step()
dist.barrier()
first_done = time.time()
step_times = []
for _ in range(STEPS):
    t0 = time.perf_counter()
    train_step()
    step_times.append(time.perf_counter() - t0)
dist.barrier()
"""

TORCHRUN_MAIN = """
import json
import torch.distributed as dist

dist.init_process_group("gloo")
{code}
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({{"first_done": first_done, "step_times": step_times}}),
          flush=True)
dist.destroy_process_group()
"""

#: Notebook 11 pastes the DDP tutorial (pytorch/tutorials, intermediate_source/ddp_tutorial.rst)
#: as published, the CUDA devices of its demos changed to the CPU; the bench runs those cells.
NOTEBOOK = HERE.parents[1] / "notebooks" / "11_ddp_tutorial.ipynb"


def _tutorial_cells() -> tuple[str, str]:
    """Notebook 11's cells with the launcher (``setup``/``cleanup``) and ``demo_basic``/
    ``run_demo``, and demo_basic's training step (between ``setup`` and ``cleanup``)."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    launcher = next(c for c in code if "def setup(" in c)
    demo = next(c for c in code if "def demo_basic(" in c)
    step = re.search(r"def demo_basic\(.*?setup\(rank, world_size\)\n(.*?)\n    cleanup\(\)",
                     demo, re.S)
    if step is None:
        raise RuntimeError(f"{NOTEBOOK.name}: demo_basic no longer calls setup() then cleanup()")
    return launcher + "\n\n" + demo + "\n", step.group(1) + "\n"


#: The DDP tutorial's code as the notebook pastes it, and demo_basic's training step.
DDP_TUTORIAL, _STEP = _tutorial_cells()

#: The tutorial's torchrun variant of demo_basic (its ``elastic_ddp.py``): torchrun's agent
#: keeps the rendezvous store, so ``setup()``'s MASTER_PORT would lead nowhere.
DDP_ELASTIC = """

def demo_basic_elastic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")
""" + _STEP + """
    dist.destroy_process_group()
"""

#: How each script kind calls the tutorial's code.
DDP_MAINS = {
    "torchrun": "demo_basic_elastic()\n",
    "mp.spawn": "run_demo(demo_basic, {n})\n",
}

SIZES = {
    "full": {"workers": 3, "WIDTH": 512, "LAYERS": 4, "BATCH": 256, "STEPS": 20, "rounds": 3},
    "smoke": {"workers": 1, "WIDTH": 16, "LAYERS": 2, "BATCH": 8, "STEPS": 3, "rounds": 1},
}


def train_code(sizes: dict) -> str:
    """The training code with its sizes bound at the top."""
    head = "".join(f"{k} = {sizes[k]}\n" for k in ("WIDTH", "LAYERS", "BATCH", "STEPS"))
    return head + TRAIN


def _shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    import nbdist

    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"  # nothing written to IPYTHONDIR
    shell = InteractiveShell.instance(config=cfg)
    nbdist.load_ipython_extension(shell)
    return shell


def run_nbdist(shell: Any, sizes: dict, timeout: float) -> dict:
    """One world from the magic: time to first step and the step times on rank 0."""
    import nbdist

    code = train_code(sizes)
    t0 = time.time()
    try:
        shell.run_line_magic("dist_start", f"{sizes['workers']} --process-group gloo --threads 1")
        res = shell.run_cell(f"%%dist --local --timeout {timeout:g}\n{code}",
                             store_history=False)
        if not res.success:
            raise RuntimeError(f"the %%dist --local cell failed: {res.error_in_exec!r}")
        ns = shell.user_ns
        return {"first_step_s": ns["first_done"] - t0, "step_times": list(ns["step_times"])}
    finally:
        nbdist.stop()


def run_torchrun(sizes: dict, timeout: float, workdir: Path) -> dict:
    """The same code under ``torchrun --standalone`` with as many ranks."""
    script = workdir / "spmd_step.py"
    script.write_text(TORCHRUN_MAIN.format(code=train_code(sizes)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={sizes['workers'] + 1}", str(script)],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=workdir)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    if proc.returncode != 0:  # after the steps were timed: torch's own exit, not measured
        # (seen once in CI: rank 0 aborted in destroy_process_group with "terminate called
        # without an active exception", after printing its result)
        print(f"torchrun exited with {proc.returncode} after its result (torch's exit, "
              f"not timed): {proc.stderr.strip().splitlines()[:1]}", file=sys.stderr)
    out = json.loads(line[len("RESULT "):])
    return {"first_step_s": out["first_done"] - t0, "step_times": out["step_times"]}


def run_tutorial_nbdist(shell: Any, n: int) -> dict:
    """``run_demo(demo_basic, n)`` from a cell: once starting the world, once in it."""
    import nbdist

    nbdist.stop()
    res = shell.run_cell(DDP_TUTORIAL, store_history=False)
    if not res.success:
        raise RuntimeError(f"the tutorial's cell failed: {res.error_in_exec!r}")
    times = []
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            res = shell.run_cell(f"run_demo(demo_basic, {n})", store_history=False)
            times.append(time.perf_counter() - t0)
            if not res.success:
                raise RuntimeError(f"run_demo failed in the shell: {res.error_in_exec!r}")
    finally:
        nbdist.stop()
    return {"start_s": times[0], "again_s": times[1]}


def run_tutorial_script(kind: str, n: int, timeout: float, workdir: Path) -> dict:
    """The tutorial's code as a script, under torchrun or ``python`` (mp.spawn): time to done."""
    script = workdir / "ddp_tutorial.py"
    main = DDP_MAINS[kind].format(n=n)
    code = DDP_TUTORIAL.replace("'12355'", f"'{_free_port()}'")  # 12355 may be taken here
    script.write_text(code + DDP_ELASTIC + '\n\nif __name__ == "__main__":\n    ' + main)
    cmd = [sys.executable, str(script)] if kind == "mp.spawn" else [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={n}", str(script)]
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV}
    env["PYTHONWARNINGS"] = "ignore"
    crashes: list[str] = []
    for _ in range(SCRIPT_TRIES):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=workdir)
        seconds = time.perf_counter() - t0
        if proc.returncode == 0 and proc.stdout.count("basic DDP example on rank") == n:
            return {"done_s": seconds, "crashes": crashes}
        crash = _torch_crash(proc.stdout + proc.stderr)
        if crash is None:
            raise RuntimeError(f"{kind} exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n"
                               f"{proc.stderr[-3000:]}")
        crashes.append(crash)
        print(f"tutorial {kind}: torch's own run crashed ({crash}); running it again", flush=True)
    raise RuntimeError(f"{kind}: torch's own run crashed {SCRIPT_TRIES} times in a row: "
                       + "; ".join(crashes))


#: How often a script kind is run before its crashes count as the bench's failure: on torch
#: 2.13 (CPU) the tutorial under torchrun aborted at exit in 4 of 10 runs, after its work.
SCRIPT_TRIES = 6

#: Crashes of plain torch's own run of the tutorial (not of the bench): the script's ranks die
#: in torch's C++ at exit, e.g. a Gloo thread still joinable when its group is freed.
_TORCH_CRASHES = ("terminate called without an active exception", "Signal 6 (SIGABRT)",
                  "Signal 11 (SIGSEGV)", "exitcode  : -6", "exitcode  : -11")


def _torch_crash(log: str) -> str | None:
    """The first sign in ``log`` that torch itself crashed, or None for any other failure."""
    hits = [(log.find(sign), sign) for sign in _TORCH_CRASHES if sign in log]
    return min(hits)[1] if hits else None


#: What the shell's run left in this process's environment (the tutorial's setup() sets the
#: first two on rank 0); a launched script starts without them, as from a fresh shell.
_LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize_tutorial(rounds: list[dict]) -> dict:
    """Median time to done of each kind (nbdist: starting its world, and in it)."""
    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds if r["kind"] == kind)

    def crashes(kind: str) -> int:
        return sum(len(r.get("crashes", ())) for r in rounds if r["kind"] == kind)

    return {"nbdist_start_s": med("nbdist", "start_s"), "nbdist_again_s": med("nbdist", "again_s"),
            "torchrun_s": med("torchrun", "done_s"), "mp_spawn_s": med("mp.spawn", "done_s"),
            "torchrun_crashes": crashes("torchrun"), "mp_spawn_crashes": crashes("mp.spawn")}


def _commit() -> dict:
    return {"commit": _common.measured_commit()}


def summarize(rounds: list[dict]) -> dict:
    """Per kind: cold (nbdist's first round), warm/first-step medians, median step time."""
    out: dict = {}
    for kind in ("nbdist", "torchrun"):
        rs = [r for r in rounds if r["kind"] == kind]
        firsts = [r["first_step_s"] for r in rs]
        warm = firsts[1:] if kind == "nbdist" and len(firsts) > 1 else firsts
        out[kind] = {
            "first_step_s": statistics.median(warm),
            "first_step_cold_s": firsts[0] if kind == "nbdist" else None,
            "step_ms": statistics.median(t for r in rs for t in r["step_times"]) * 1e3,
        }
    out["ratio_first_step"] = out["torchrun"]["first_step_s"] / out["nbdist"]["first_step_s"]
    out["ratio_step"] = out["nbdist"]["step_ms"] / out["torchrun"]["step_ms"]
    return out


def render(res: dict) -> str:
    s, z, m = res["summary"], res["sizes"], res["machine"]
    commit = m["nbdist"].get("commit", "?")
    lines = [
        f"# SPMD from a notebook vs torchrun — {m['date']}", "",
        f"{m['cores']} cores, load {m['load_start'][0]:.1f} at the start; torch {m['torch']}; "
        f"Python {m['python']}; nbdist at {commit}; mode {res['mode']}.", "",
        f"FSDP2 (`fully_shard` per block and the root) over {z['workers'] + 1} ranks, gloo, CPU: "
        f"{z['LAYERS']} x Linear({z['WIDTH']}, {z['WIDTH']}) + ReLU and a head, batch "
        f"{z['BATCH']} on every rank; {z['rounds']} round(s) each, {z['STEPS']} timed steps "
        "per round.", "",
        "| | time to first step, s | step time, median ms |", "|---|---|---|",
        f"| `%dist_start` + `%%dist --local` ({'warm template' if z['rounds'] > 1 else 'cold'}) "
        f"| {s['nbdist']['first_step_s']:.2f} | {s['nbdist']['step_ms']:.2f} |",
        *([f"| the same, first world of the process (cold) | "
           f"{s['nbdist']['first_step_cold_s']:.2f} | |"] if z["rounds"] > 1 else []),
        f"| `torchrun --standalone` | {s['torchrun']['first_step_s']:.2f} | "
        f"{s['torchrun']['step_ms']:.2f} |", "",
        f"torchrun takes {s['ratio_first_step']:.2f}x as long as the notebook's world to its "
        f"first step; a step from the notebook takes {s['ratio_step']:.2f}x torchrun's.",
    ]
    t = res.get("tutorial")
    if t is not None:
        n = t["nprocs"]
        lines += [
            "", f"## The DDP tutorial's `run_demo(demo_basic, {n})`", "",
            f"The tutorial's code (`setup` with port 12355, `demo_basic` on the CPU, `run_demo` "
            f"calling `mp.spawn`), {n} processes; {t['rounds']} round(s) each, the order "
            "alternating. Time to done: from the call (the launch) to the last rank's return.",
            "", "| | time to done, s |", "|---|---|",
            f"| nbdist: `run_demo` in a cell, no world yet (the spawn starts one) | "
            f"{t['summary']['nbdist_start_s']:.2f} |",
            f"| nbdist: `run_demo` again, in that world | {t['summary']['nbdist_again_s']:.2f} |",
            f"| `torchrun --standalone` on the script | {t['summary']['torchrun_s']:.2f} |",
            f"| `python script.py` (the tutorial's `mp.spawn`) | "
            f"{t['summary']['mp_spawn_s']:.2f} |",
        ]
        crashed = {k: t["summary"].get(f"{k}_crashes", 0) for k in ("torchrun", "mp_spawn")}
        if any(crashed.values()):
            lines += ["", "Plain torch's own runs crashed at exit and were run again (not "
                      "timed): " + ", ".join(f"{k.replace('_', '.')} {c}" for k, c in
                                             crashed.items() if c) + "."]
    return "\n".join(lines) + "\n"


def run_tutorial(shell: Any, sizes: dict, timeout: float, workdir: Path) -> dict:
    """Every kind of the tutorial's ``run_demo``, taking turns."""
    n, rounds = sizes["workers"] + 1, []
    for i in range(sizes["rounds"]):
        kinds = ("nbdist", "torchrun", "mp.spawn")
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            if kind == "nbdist":
                r = run_tutorial_nbdist(shell, n)
            else:
                r = run_tutorial_script(kind, n, timeout, workdir)
            rounds.append({"kind": kind, **r})
            print(f"round {i + 1} tutorial {kind}: " + ", ".join(
                f"{k} {v:.2f}s" for k, v in r.items() if isinstance(v, float)), flush=True)
    return {"nprocs": n, "rounds": sizes["rounds"], "runs": rounds,
            "summary": summarize_tutorial(rounds)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None, help="rounds per kind")
    ap.add_argument("--timeout", type=float, default=300.0, help="per world, seconds")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    out = _common.out_dir(args)
    mode = "smoke" if args.smoke else "full"
    sizes = dict(SIZES[mode])
    if args.rounds is not None:
        sizes["rounds"] = args.rounds
    import torch

    machine = {"nbdist": _commit(), "cores": os.cpu_count(), "load_start": list(os.getloadavg()),
               "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "torch": torch.__version__, "python": platform.python_version()}
    shell = _shell()
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-spmd-") as tmp:
        for i in range(sizes["rounds"]):
            order = ("nbdist", "torchrun") if i % 2 == 0 else ("torchrun", "nbdist")
            for kind in order:
                if kind == "nbdist":
                    r = run_nbdist(shell, sizes, args.timeout)
                else:
                    r = run_torchrun(sizes, args.timeout, Path(tmp))
                rounds.append({"kind": kind, **r})
                print(f"round {i + 1} {kind}: first step after {r['first_step_s']:.2f}s, "
                      f"median step {statistics.median(r['step_times']) * 1e3:.2f} ms",
                      flush=True)
        tutorial = run_tutorial(shell, sizes, args.timeout, Path(tmp))
    res = {"mode": mode, "sizes": sizes, "machine": machine, "rounds": rounds,
           "summary": summarize(rounds), "tutorial": tutorial}
    (out / "spmd.json").write_text(json.dumps(res, indent=1) + "\n")
    text = render(res)
    (out / "spmd.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
