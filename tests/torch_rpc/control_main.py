"""One rank of the control (``control.py``): plain torch, nothing of nbdist."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["main"]

STALL_S = 90.0  # control.STALL: a barrier waits a few times this before it gives up


def main(rank: str, n: str, where: str, tests_file: str, start: str) -> None:
    """One rank of the control (strings: from its command line)."""
    rank, n, start = int(rank), int(n), int(start)  # type: ignore[assignment]
    from datetime import timedelta

    import runner
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    tests = json.loads(Path(tests_file).read_text())
    proto = runner.instance(tests[0]["cls"], tests[0]["name"], rank, f"{where}/init{start}")
    rpc.init_rpc(f"worker{rank}", backend=proto.rpc_backend, rank=rank, world_size=n,
                 rpc_backend_options=proto.rpc_backend_options)
    store = dist.FileStore(f"{where}/barrier{start}", n)
    for k, t in enumerate(tests[start:], start):
        store.set(f"{k}/{rank}", "1")
        store.wait([f"{k}/{r}" for r in range(n)], timedelta(seconds=STALL_S * 4))
        runner.run_one(t["cls"], t["name"], rank, f"{where}/file{k}", "body", f"{where}/out")
    store.set(f"end/{rank}", "1")
    store.wait([f"end/{r}" for r in range(n)], timedelta(seconds=STALL_S))
    sys.stdout.flush()
    os._exit(0)  # as a launched test process ends: no graceful shutdown to wait for
