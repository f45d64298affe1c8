"""A parameter server's step time with the shared-memory path off and on (issue 29).

``python bench/shm/ps_shm.py`` (part of ``make bench``). The batch-updating parameter server of
pytorch/examples ``distributed/rpc/batch/parameter_server.py`` and of notebook 03: every
trainer sends its gradients to the server (``@rpc.functions.async_execution``), the server
steps once it has them all and returns the model to every trainer. The server is rank 0 (this
process, as the notebook is), the trainers are workers; classes are defined here in
``__main__``, as notebook cells define them. Two models:

- **ResNet-50** (the upstream example's: 5 trainers): its 161 parameter tensors with the
  shapes of torchvision's ``resnet50`` (25.6 M parameters, 102 MB), built from the
  architecture here (no torchvision on this machine, no weights needed). The trainers'
  "backward" is one cheap pass that gives every parameter a gradient, so the step time is
  dominated by moving gradients and models, which is what is measured.
- **DigitsNet** (notebook 03's, 4 trainers, batch 32 of the 8x8 digits shapes): small
  tensors only, all under the path's threshold: it must not change.

Each configuration runs in a fresh world with ``NBDIST_SHM=0`` and ``=1`` in turn, interleaved
over rounds; reported: seconds per step (median and best of the rounds' medians). Writes
``bench/results/ps_shm.json`` and ``ps_shm.md``; ``--smoke``: tiny, results to a temporary
directory. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch import optim

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402
from _shapes import resnet50_shapes  # noqa: E402

import nbdist  # noqa: E402

__all__ = ["BatchUpdateParameterServer", "DigitsNet", "ResNet50Shapes", "Trainer", "main",
           "resnet50_shapes"]


class ResNet50Shapes(nn.Module):
    """ResNet-50's parameters; ``forward`` is a cheap function of all of them."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        shapes = resnet50_shapes()
        if scale != 1.0:  # --smoke: the same tensors, fewer elements
            shapes = [tuple(max(1, int(d * scale)) for d in s) for s in shapes]
        self.params = nn.ParameterList(nn.Parameter(torch.randn(s) * 0.01) for s in shapes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(p.sum() for p in self.params) * x.mean()


class DigitsNet(nn.Module):
    """Notebook 03's model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class BatchUpdateParameterServer:
    """pytorch/examples' batch parameter server (as notebook 03 runs it)."""

    def __init__(self, model: nn.Module, batch_update_size: int, lr: float) -> None:
        self.model = model
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)
        # the bench's own: seconds of each step spent adding gradients, in the optimizer, and
        # in set_result (which pickles and sends every trainer's reply on this thread)
        self.phases: list[tuple[float, float, float]] = []
        self.adding = 0.0

    def get_model(self) -> nn.Module:
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref: Any, grads: list) -> Any:
        self = ps_rref.local_value()
        with self.lock:
            self.curr_update_size += 1
            t0 = time.perf_counter()
            for p, g in zip(self.model.parameters(), grads, strict=True):
                p.grad += g
            self.adding += time.perf_counter() - t0
            fut = self.future_model
            if self.curr_update_size >= self.batch_update_size:
                t1 = time.perf_counter()
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                t2 = time.perf_counter()
                fut.set_result(self.model)
                self.phases.append((self.adding, t2 - t1, time.perf_counter() - t2))
                self.adding = 0.0
                self.future_model = torch.futures.Future()
        return fut


class Trainer:
    """One trainer: fetch the model, then per step a backward and a gradient round trip."""

    def __init__(self, shape: tuple, seed: int) -> None:
        self.shape, self.gen = shape, torch.Generator().manual_seed(seed)

    def train(self, ps_rref: Any, steps: int) -> list[float]:
        model = ps_rref.rpc_sync().get_model()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            x = torch.rand(self.shape, generator=self.gen)
            out = model(x)
            (F.cross_entropy(out, torch.zeros(len(out), dtype=torch.long)) if out.dim() == 2
             else out).backward()
            model = rpc.rpc_sync(ps_rref.owner(),
                                 BatchUpdateParameterServer.update_and_fetch_model,
                                 args=(ps_rref, [p.grad for p in model.parameters()]))
            times.append(time.perf_counter() - t)
        return times


CONFIGS = {  # name -> (model factory, trainers, input shape per step)
    "ResNet-50 (5 trainers)": (lambda scale: ResNet50Shapes(scale), 5, (8, 3)),
    "notebook 03 DigitsNet (4 trainers)": (lambda scale: DigitsNet(), 4, (32, 1, 8, 8)),
}


def one_world(name: str, shm_on: bool, steps: int, scale: float) -> tuple[list[float], list]:
    """Seconds per step of every trainer (after one step of warm-up), in a fresh world, and
    the server's phases of each step after the first (``BatchUpdateParameterServer.phases``)."""
    make, trainers, shape = CONFIGS[name]
    os.environ["NBDIST_SHM"] = "1" if shm_on else "0"
    torch.manual_seed(0)
    c = nbdist.start(trainers, name="ps", worker_name="trainer{rank}", threads=1, quiet=True)
    try:
        ps = BatchUpdateParameterServer(make(scale), trainers, 0.01)
        ps_rref = rpc.RRef(ps)
        remote = [rpc.remote(n, Trainer, args=(shape, i)) for i, n in enumerate(c.names[1:])]
        futs = [t.rpc_async(timeout=0).train(ps_rref, steps + 1) for t in remote]
        per = [fut.wait()[1:] for fut in futs]
        del remote, ps_rref, futs
        return [statistics.median(step) for step in zip(*per, strict=True)], ps.phases[1:]
    finally:
        c.stop()
        os.environ.pop("NBDIST_SHM", None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.smoke else 3)
    steps = args.steps or (2 if args.smoke else 8)
    scale = 0.05 if args.smoke else 1.0
    out = _common.out_dir(args)
    torch.set_num_threads(1)
    t0 = time.monotonic()
    samples: dict[str, dict[str, list[float]]] = {}
    server: dict[str, dict[str, list[list[float]]]] = {}  # name -> on/off -> [add, opt, reply]
    for r in range(rounds):
        for name in CONFIGS:
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                key = "on" if on else "off"
                step_s, phases = one_world(name, on, steps, scale)
                samples.setdefault(name, {}).setdefault(key, []).append(statistics.median(step_s))
                server.setdefault(name, {}).setdefault(key, []).append(
                    [statistics.median(x) for x in zip(*phases, strict=True)] if phases else [])
        print(f"round {r + 1}/{rounds} (load {os.getloadavg()[0]:.1f})", flush=True)
    res = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
           "commit": _common.measured_commit(),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "torch": torch.__version__, "rounds": rounds, "steps": steps,
           "load_1min": round(os.getloadavg()[0], 1), "smoke": args.smoke,
           "seconds": round(time.monotonic() - t0, 1), "step_s": samples,
           "server_s": server}
    (out / "ps_shm.json").write_text(json.dumps(res, indent=1))
    text = render(res)
    (out / "ps_shm.md").write_text(text)
    print(text)
    return 0


def render(res: dict) -> str:
    lines = ["# Parameter server step time, shared-memory path off vs on", "",
             f"{res['machine']}; torch {res['torch']}; nbdist at {res['commit']}; "
             f"{res['when']}; {res['rounds']} rounds interleaved (off/on order flips), "
             f"{res['steps']} steps each after one warm-up, a fresh world per run; 1-min load "
             f"average {res['load_1min']} at the end (on a shared machine the figures are "
             "noisy: read the ratio). `python bench/shm/ps_shm.py`.", "",
             "On a loaded machine the second world of an off/on pair often ran slower "
             "whichever it was (a separate check of DigitsNet, 20 steps, off-on-on-off: "
             "11, 62, 11, 59 ms per step): small-step rows are dominated by that order "
             "effect, hence the flipped order and the several rounds.", "",
             "| workload | `NBDIST_SHM=0` s/step (median, best) | `NBDIST_SHM=1` s/step "
             "(median, best) | off / on (medians) |", "|---|---|---|---|"]
    for name, d in res["step_s"].items():
        off, on = d["off"], d["on"]
        mo, mn = statistics.median(off), statistics.median(on)
        lines.append(f"| {name} | {mo:.3f}, {min(off):.3f} | {mn:.3f}, {min(on):.3f} | "
                     f"**{mo / mn:.2f}×** |")
    lines += ["", "The server's part of a step (ms, median over the worlds of each world's median "
              "step): adding the trainers' gradients (all of them), the optimizer, and "
              "`set_result`, which pickles and sends every trainer's reply (the model) on the "
              "server's thread: with the path on, each reply's tensors are copied into the "
              "server's arena there, one trainer after the other; with it off, TensorPipe's "
              "threads carry them and each trainer's side copies its own.", "",
              "| workload | path | add gradients | optimizer | replies (`set_result`) |",
              "|---|---|---|---|---|"]
    for name, d in res.get("server_s", {}).items():
        for key in ("off", "on"):
            rows = [r for r in d.get(key, []) if r]
            if rows:
                add, opt, reply = (statistics.median(col) * 1e3 for col in zip(*rows, strict=True))
                lines.append(f"| {name} | {key} | {add:.1f} | {opt:.1f} | {reply:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
