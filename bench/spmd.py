"""What running SPMD code from a notebook costs: one FSDP2 model, `%%dist --local` vs torchrun.

``python bench/spmd.py [--smoke]`` (part of ``make bench``). The same training code (a small
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _common  # noqa: E402

__all__ = ["main", "train_code"]

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
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    return {"first_step_s": out["first_done"] - t0, "step_times": out["step_times"]}


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
    return "\n".join(lines) + "\n"


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
    res = {"mode": mode, "sizes": sizes, "machine": machine, "rounds": rounds,
           "summary": summarize(rounds)}
    (out / "spmd.json").write_text(json.dumps(res, indent=1) + "\n")
    text = render(res)
    (out / "spmd.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
