"""One rank of a plain torch RPC world (no nbdist imported): the baseline of ``bench/rpc/rpc.py``.

``python bench/_rpc_plain.py RANK INIT_URL``. Rank 1 serves until shutdown. Rank 0 prints
``ready``, then reads lines ``KIND NBYTES N WINDOW`` from stdin and answers each with one JSON
list of seconds per call (``bench/_rpc_loops.measure``, function and class by reference);
``large KIND NBYTES N`` answers the same for ``_rpc_loops.measure_large``; ``many SCALE N``
for ``N`` echoes of ResNet-50's 161 tensors (``_shapes.resnet50_tensors(SCALE)``); ``quit``
shuts the world down.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402
from _echo import EchoBox, echo, held, nbytes_of  # noqa: E402
from _rpc_loops import measure, measure_large, tensor  # noqa: E402
from _shapes import resnet50_tensors  # noqa: E402


def main(rank: int, init: str, threads: int) -> None:
    torch.set_num_threads(threads)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=init, rpc_timeout=120)
    rpc.init_rpc(f"plain{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        box = rpc.remote("plain1", EchoBox)
        print("ready", flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] == "quit":
                break
            if cmd[0] == "many":  # many SCALE N
                lat = measure_large("echo", "plain1", (echo, nbytes_of, held),
                                    resnet50_tensors(float(cmd[1])), int(cmd[2]))
                print(json.dumps(lat), flush=True)
                continue
            if cmd[0] == "large":  # large KIND NBYTES N
                lat = measure_large(cmd[1], "plain1", (echo, nbytes_of, held),
                                    tensor(int(cmd[2])), int(cmd[3]))
                print(json.dumps(lat), flush=True)
                continue
            kind, nbytes, n, window = cmd[0], int(cmd[1]), int(cmd[2]), int(cmd[3])
            lat = measure(kind, "plain1", echo, box, tensor(nbytes), n, window)
            print(json.dumps(lat), flush=True)
        del box
    rpc.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
