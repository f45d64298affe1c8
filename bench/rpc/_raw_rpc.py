"""One rank of a plain torch RPC world (no nbdist imported): the baseline for bench/rpc/metrics.py.

``python bench/rpc/_raw_rpc.py RANK INIT_URL``. Rank 1 serves until shutdown. Rank 0 reads lines
from stdin: ``N`` runs N ``rpc_sync`` echo calls of a one-element tensor and prints their
latencies in microseconds as one JSON list; ``quit`` shuts the world down.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402
from _echo import echo  # noqa: E402


def main(rank: int, init: str) -> None:
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init, rpc_timeout=60)
    rpc.init_rpc(f"raw{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        x = torch.ones(1)
        print("ready", flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "quit":
                break
            lat = []
            for _ in range(int(cmd)):
                t0 = time.perf_counter()
                rpc.rpc_sync("raw1", echo, args=(x,))
                lat.append((time.perf_counter() - t0) * 1e6)
            print(json.dumps(lat), flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
