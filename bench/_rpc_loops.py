"""The timed loops of ``bench/rpc/rpc.py``, shared by the plain torch child and the nbdist side
(this module never imports nbdist), so both run the very same Python."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed.rpc as rpc

__all__ = ["KINDS", "LARGE", "LARGE_KINDS", "copy_floor", "measure", "measure_large", "tensor"]

LARGE = {"16 MB": 16 << 20, "64 MB": 64 << 20, "256 MB": 256 << 20}
LARGE_KINDS = ("echo", "argument", "result")  # there and back; only sent; only returned

PAYLOADS = {"16 B": 16, "64 KB": 64 << 10, "1 MB": 1 << 20, "16 MB": 16 << 20,
            "64 MB": 64 << 20}
KINDS = ("rpc_sync", "rpc_async", "remote", "proxy")  # "builtin" (torch.add) is a control


def tensor(nbytes: int) -> torch.Tensor:
    """A float32 tensor of ``nbytes`` bytes."""
    return torch.ones(max(nbytes // 4, 1))


def measure(kind: str, to: str, fn: Any, box: Any, x: torch.Tensor, n: int,
            window: int) -> list[float]:
    """Seconds per call, ``n`` calls (``rpc_async``: per call of pipelined windows)."""
    out: list[float] = []
    perf = time.perf_counter
    if kind == "rpc_sync":
        for _ in range(n):
            t = perf()
            rpc.rpc_sync(to, fn, args=(x,))
            out.append(perf() - t)
    elif kind == "rpc_async":
        for _ in range(max(n // window, 1)):
            t = perf()
            futs = [rpc.rpc_async(to, fn, args=(x,)) for _ in range(window)]
            torch.futures.wait_all(futs)
            out.append((perf() - t) / window)
    elif kind == "remote":  # rpc.remote of the function, then fetch the value
        for _ in range(n):
            t = perf()
            rpc.remote(to, fn, args=(x,)).to_here()
            out.append(perf() - t)
    elif kind == "proxy":  # a method of an object held in an RRef, through its proxy
        for _ in range(n):
            t = perf()
            box.rpc_sync().echo(x)
            out.append(perf() - t)
    elif kind == "builtin":  # torch.add runs in C++ on the callee: no Python pickling there
        for _ in range(n):
            t = perf()
            rpc.rpc_sync(to, torch.add, args=(x, 1))
            out.append(perf() - t)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return out


def measure_large(kind: str, to: str, fns: tuple, x: torch.Tensor, n: int) -> list[float]:
    """Seconds per ``rpc_sync``: ``echo`` (``x`` there and back), ``argument`` (``x`` sent,
    its size returned) or ``result`` (the callee returns a tensor as large as ``x`` that it
    holds); ``fns`` is (echo, nbytes_of, held)."""
    echo, nbytes_of, held = fns
    perf = time.perf_counter
    out: list[float] = []
    for _ in range(n):
        if kind == "echo":
            t = perf()
            r = rpc.rpc_sync(to, echo, args=(x,))
        elif kind == "argument":
            t = perf()
            r = rpc.rpc_sync(to, nbytes_of, args=(x,))
        elif kind == "result":
            t = perf()
            r = rpc.rpc_sync(to, held, args=(x.nbytes,))
        else:
            raise ValueError(f"unknown kind {kind!r}")
        out.append(perf() - t)
        del r  # as a loop body that uses the value and drops it
    return out


def copy_floor(x: torch.Tensor, copies: int, n: int) -> list[float]:
    """Seconds to copy ``x`` ``copies`` times with ``Tensor.copy_`` into memory allocated
    (and faulted in) beforehand: what moving its bytes costs at the least, in one process."""
    bufs = [torch.empty_like(x) for _ in range(copies)]
    for b in bufs:
        b.copy_(x)
    perf = time.perf_counter
    out = []
    for _ in range(n):
        t = perf()
        src = x
        for b in bufs:
            b.copy_(src)
            src = b
        out.append(perf() - t)
    return out
