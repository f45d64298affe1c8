"""The lines every case program starts with: how a rank writes down what it observes.

``record(who, key, value)`` appends ``[key, value]`` to ``$CONF_OUT/<who>.jsonl``; ``who`` names
the process as the program knows it (``r<RANK>`` under torchrun, ``p<i>`` for process i of an
``mp.spawn``, ``parent``). ``state`` records what torch says of the default group,
``attempt`` a call's value or the name of what it raised. The program reads nothing else from
the harness but ``CONF_OUT`` and ``CONF_PORT``/``CONF_PORT2`` (free ports, where its source
names one), so it is the same text in both runs.
"""

from __future__ import annotations

__all__ = ["PRELUDE"]

PRELUDE = '''\
import json, os, socket, sys
from datetime import timedelta
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def record(who, key, value):
    with open(os.path.join(os.environ["CONF_OUT"], f"{who}.jsonl"), "a") as f:
        f.write(json.dumps([key, value]) + "\\n")


def state(who, key):
    s = {"initialized": dist.is_initialized()}
    try:
        s.update(rank=dist.get_rank(), size=dist.get_world_size(),
                 backend=str(dist.get_backend()))
    except Exception as e:
        s["raised"] = type(e).__name__
    record(who, key, s)


def attempt(who, key, fn):
    try:
        record(who, key, {"value": fn()})
    except Exception as e:
        record(who, key, {"raised": type(e).__name__})


def port_open(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


PORT, PORT2 = int(os.environ["CONF_PORT"]), int(os.environ["CONF_PORT2"])
'''
