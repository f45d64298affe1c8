"""Medium messages through the shared-memory path against plain torch (issue 35).

``python bench/shm/shm_medium.py`` (part of ``make bench``). In one run: this process is rank 0
of ``nbdist.start(1)``, and a plain torch world of two processes that never import nbdist
(``_rpc_plain.py``, driven as ``bench/rpc/rpc.py`` does) runs beside it. Contenders take turns
block by block (``--block`` calls each), the order rotating every round:

- **One tensor**: echo of a float32 tensor of 0.25, 0.5, 1, 2, 4, 8 and 16 MB to the peer and
  back.
  ``plain torch``; ``nbdist`` as shipped (threshold ``NBDIST_SHM_MIN_KB``, default
  ``shm.DEFAULT_MIN_KB``); ``nbdist, path on`` (threshold 1 byte: the arena carries it at
  every size); ``nbdist, path off`` (threshold above the size: TensorPipe carries it,
  through nbdist's pickler).
- **Many tensors**: echo of ResNet-50's 161 gradients as one list (``_shapes``; 97 MB, the
  largest 9 MB, 143 under 2 MB). ``plain torch``; ``nbdist, one span`` (as shipped: once the
  message met the threshold's bytes every tensor joins one arena span); ``nbdist, large only``
  (``shm.PACK_MIN`` raised: tensors over the threshold share a slot, the rest take
  TensorPipe, as before issue 35); ``nbdist, path off``.

Reported: best and median ms per echo, and plain / contender (> 1: faster than plain torch).
Writes ``bench/results/shm_medium.json`` and ``shm_medium.md``; ``--smoke``: 1 and 2 MB, the
gradients shrunk, one round, results to a temporary directory. Every process it starts is
stopped.
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

import torch
import torch.distributed.rpc as rpc

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this family's helpers, then bench/'s
import _common  # noqa: E402
from _echo import echo, held, nbytes_of  # noqa: E402
from _plain_world import Plain  # noqa: E402
from _rpc_loops import measure_large, tensor  # noqa: E402
from _shapes import resnet50_tensors  # noqa: E402
from _shm_probes import set_min_bytes, set_pack_bytes  # noqa: E402

import nbdist  # noqa: E402
from nbdist.shm import transport as shm  # noqa: E402

__all__ = ["MANY", "ONE", "main", "many_tensors", "one_tensor", "render"]

MB = 1 << 20
PEER = "worker1"
NEVER = 1 << 60  # a threshold no tensor reaches
ONE = ("plain torch", "nbdist", "nbdist, path on", "nbdist, path off")
MANY = ("plain torch", "nbdist, one span", "nbdist, large only", "nbdist, path off")


def _limits(min_bytes: int, pack_bytes: int) -> None:
    """The path's threshold and packing size, in both processes of the nbdist world."""
    set_min_bytes(min_bytes)
    set_pack_bytes(pack_bytes)
    rpc.rpc_sync(PEER, set_min_bytes, args=(min_bytes,))
    rpc.rpc_sync(PEER, set_pack_bytes, args=(pack_bytes,))


def _rounds(contenders: tuple, run: Callable[[str], list[float]], rounds: int) -> dict:
    """Each contender's seconds per call over ``rounds`` rounds, order rotating per round;
    one block of each first, not counted (warm-up)."""
    times: dict[str, list[float]] = {c: [] for c in contenders}
    for c in contenders:
        run(c)
    k = len(contenders)
    for r in range(rounds):
        for i in range(k):
            c = contenders[(i + r) % k]
            times[c] += run(c)
    return {c: {"best_ms": min(ts) * 1e3, "median_ms": statistics.median(ts) * 1e3,
                "n": len(ts)} for c, ts in times.items()}


def one_tensor(plain: Plain, sizes_mb: list[float], rounds: int, block: int) -> dict:
    """Echo of one tensor per size: every contender of ``ONE``."""
    fns = (echo, nbytes_of, held)
    shipped = shm._current_config().min_bytes
    out = {}
    for mb in sizes_mb:
        nbytes = int(mb * MB)
        x = tensor(nbytes)

        def run(c: str, x: torch.Tensor = x, nbytes: int = nbytes) -> list[float]:
            if c == "plain torch":
                return plain.measure_large("echo", nbytes, block)
            limit = {"nbdist": shipped, "nbdist, path on": 1}.get(c, NEVER)
            _limits(limit, shm.PACK_MIN)
            return measure_large("echo", PEER, fns, x, block)

        out[f"{mb:g} MB"] = _rounds(ONE, run, rounds)
        print(f"one tensor, {mb:g} MB done (load {os.getloadavg()[0]:.1f})", flush=True)
    _limits(shipped, shm.PACK_MIN)
    return out


def many_tensors(plain: Plain, scale: float, rounds: int, block: int) -> dict:
    """Echo of ResNet-50's 161 gradients as one list: every contender of ``MANY``."""
    fns = (echo, nbytes_of, held)
    shipped = shm._current_config().min_bytes
    xs = resnet50_tensors(scale)

    def run(c: str) -> list[float]:
        if c == "plain torch":
            return plain.measure_many(scale, block)
        _limits(NEVER if c == "nbdist, path off" else shipped,
                NEVER if c == "nbdist, large only" else shm.PACK_MIN)
        return measure_large("echo", PEER, fns, xs, block)

    res = _rounds(MANY, run, rounds)
    _limits(shipped, shm.PACK_MIN)
    return {"tensors": len(xs), "mb": sum(x.nbytes for x in xs) / MB, "largest_mb":
            max(x.nbytes for x in xs) / MB, "times": res}


def _ratio_row(name: str, cell: dict, contenders: tuple) -> str:
    base = cell[contenders[0]]
    parts = []
    for c in contenders:
        v = cell[c]
        text = f"{v['best_ms']:.2f} / {v['median_ms']:.2f}"
        if c != contenders[0]:
            text += (f" (**{base['best_ms'] / v['best_ms']:.2f}×** / "
                     f"**{base['median_ms'] / v['median_ms']:.2f}×**)")
        parts.append(text)
    return f"| {name} | " + " | ".join(parts) + " |"


def render(res: dict) -> str:
    lines = ["# Medium messages: the shared-memory path against plain torch", "",
             f"Measured at commit {res['commit']} on {res['machine']} ({res['cpus']} CPUs, "
             f"1-min load {res['load_start']} at the start, {res['load_end']} at the end; "
             "other jobs shared the machine), torch "
             f"{res['torch']}, {res['when']}; {res['seconds']} s. Written by "
             "`python bench/shm/shm_medium.py`. Contenders take turns in blocks of "
             f"{res['block']} calls, the order rotating every round, {res['rounds']} rounds "
             "(after one block each of warm-up). Each cell: best / median ms per echo; in "
             "brackets plain torch / contender, best / median (> 1: faster than plain "
             f"torch). nbdist as shipped: threshold {res['min_kb']} KB.", "",
             "## One float32 tensor to the peer and back", "",
             "| size | " + " | ".join(ONE) + " |", "|---" * (1 + len(ONE)) + "|"]
    lines += [_ratio_row(size, cell, ONE) for size, cell in res["one"].items()]
    m = res["many"]
    lines += ["", f"## ResNet-50's gradients as one list ({m['tensors']} tensors, "
              f"{m['mb']:.1f} MB, the largest {m['largest_mb']:.1f} MB) there and back", "",
              "| message | " + " | ".join(MANY) + " |", "|---" * (1 + len(MANY)) + "|",
              _ratio_row("echo", m["times"], MANY)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 12; smoke 1)")
    ap.add_argument("--block", type=int, default=2, help="calls per contender's turn")
    _common.add_arguments(ap)
    args = ap.parse_args(argv)
    os.environ["NBDIST_SHM"] = "1"
    smoke = args.smoke
    rounds = args.rounds or (1 if smoke else 12)
    sizes, scale = ([1, 2], 0.05) if smoke else ([0.25, 0.5, 1, 2, 4, 8, 16], 1.0)
    out = _common.out_dir(args)
    torch.set_num_threads(1)  # as the plain torch processes do
    t0 = time.monotonic()
    res: dict = {"commit": _common.measured_commit(), "machine": platform.node(),
                 "cpus": os.cpu_count(), "torch": torch.__version__,
                 "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 "load_start": round(os.getloadavg()[0], 1), "rounds": rounds,
                 "block": args.block}
    with tempfile.TemporaryDirectory(prefix="nbdist-bench-medium-") as tmp:
        plain = Plain(tmp)
        c = None
        try:
            c = nbdist.start(1, worker_name="worker{rank}", threads=1, quiet=True)
            res["min_kb"] = shm._current_config().min_bytes >> 10
            res["one"] = one_tensor(plain, sizes, rounds, args.block)
            res["many"] = many_tensors(plain, scale, rounds, args.block)
        finally:
            if c is not None:
                c.stop()
            plain.stop()
    res["load_end"] = round(os.getloadavg()[0], 1)
    res["seconds"] = round(time.monotonic() - t0, 1)
    (out / "shm_medium.json").write_text(json.dumps(res, indent=1) + "\n")
    text = render(res)
    (out / "shm_medium.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
