"""A name taken from torch.distributed before any world (``from torch.distributed import
init_process_group``, as pytorch/examples' multigpu.py does) joins the world's private
rendezvous like ``dist.init_process_group``: no port is opened, and the same demo runs twice
in one world (torch's own function would listen on MASTER_PORT and find its last store)."""

from __future__ import annotations

import pytest
from conftest import free_port

pytestmark = [pytest.mark.kernel]

DEMO = """%%dist --local
import os, torch
os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = "{port}"
init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
t = torch.ones(1); all_reduce(t)
print("sum", int(t.item()), "listening", port_taken({port}))
destroy_process_group()
"""


def test_names_bound_before_the_world_are_nbdists(kernel):
    port = free_port()
    setup = kernel.execute(
        "%load_ext nbdist\n"
        "from torch.distributed import init_process_group, destroy_process_group, all_reduce\n"
        "import torch.distributed as dist\n"
        "same = (init_process_group is dist.init_process_group,\n"
        "        destroy_process_group is dist.destroy_process_group)\n"
        "print(same)", timeout=180)
    assert setup.status == "ok", setup
    assert "(True, True)" in setup.stdout, setup.stdout
    start = kernel.execute("%dist_start 1", timeout=180)
    assert start.status == "ok", start
    helper = kernel.execute(
        "%%dist --local\nimport socket\n"
        "def port_taken(port):\n"
        "    with socket.socket() as s:\n"
        "        return s.connect_ex(('127.0.0.1', port)) == 0\n")
    assert helper.status == "ok", helper
    workers = kernel.execute(  # the workers bind the names too; the notebook keeps its own
        "%%dist\nfrom torch.distributed import init_process_group, destroy_process_group, "
        "all_reduce")
    assert workers.status == "ok", workers
    for _ in range(2):
        rep = kernel.execute(DEMO.format(port=port), timeout=120)
        assert rep.status == "ok", rep
        assert rep.stdout.count("sum 2 listening False") == 2, rep.stdout
    assert kernel.execute("%dist_stop").status == "ok"
