"""Issue 33: the same process-group program, run as a script (plain torch, ``mp.spawn``, no
nbdist) and from a ``--process-group gloo`` world, observes the same thing on every rank.

The program is the table's rows 1-3: a torchrun-style ``init_process_group`` and the
tutorial's ``destroy_process_group`` (afterwards ``is_initialized()`` is False and
``get_rank()`` raises ``ValueError``), then two of the three ranks form a group of their own,
numbered the other way round, at ``tcp://localhost:PORT``, and reduce in it.
"""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import textwrap

import nbdist

PROGRAM = '''
import os, torch, torch.distributed as dist

def observe(rank, port):
    seen = []
    dist.init_process_group("gloo", init_method=f"tcp://localhost:{port}", rank=rank,
                            world_size=3)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    seen.append((dist.is_initialized(), dist.get_rank(), dist.get_world_size(), t.item()))
    dist.destroy_process_group()
    try:
        dist.get_rank()
        seen.append("get_rank worked")
    except ValueError:
        seen.append((dist.is_initialized(), "ValueError"))
    if rank < 2:
        dist.init_process_group("gloo", init_method=f"tcp://localhost:{port + 1}",
                                rank=1 - rank, world_size=2)
        t = torch.tensor([float(dist.get_rank() + 10)])
        dist.all_reduce(t)
        seen.append((dist.get_rank(), dist.get_world_size(), t.item()))
        dist.destroy_process_group()
    seen.append(dist.is_initialized())
    return seen
'''

SCRIPT = PROGRAM + '''
import sys
import torch.multiprocessing as mp

def main(rank, port, out):
    with open(f"{out}.{rank}", "w") as f:
        f.write(repr(observe(rank, port)))

if __name__ == "__main__":
    mp.spawn(main, args=(int(sys.argv[1]), sys.argv[2]), nprocs=3)
'''


def _free_ports() -> int:
    """A port p with p + 1 free too (as a script's user would pick one)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no two free ports in a row")


def _as_script(tmp_path) -> dict[int, list]:
    path = tmp_path / "program.py"
    path.write_text(SCRIPT)
    out = tmp_path / "seen"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDIST")}
    subprocess.run([sys.executable, str(path), str(_free_ports()), str(out)], env=env,
                   check=True, timeout=240, capture_output=True)
    return {r: ast.literal_eval((tmp_path / f"seen.{r}").read_text()) for r in range(3)}


def test_destroy_then_a_group_of_two_renumbered_is_seen_alike_as_a_script_and_in_a_world(
        ipython, tmp_path):
    script = _as_script(tmp_path)
    ipython.run_line_magic("dist_start", "2 --process-group gloo")
    c = nbdist.current()
    ipython.run_cell_magic("dist", "--local", textwrap.dedent(PROGRAM) +
                           "seen = observe(int(os.environ['RANK']), 29400)\n")
    world = {0: ipython.user_ns["seen"]}
    world.update({r: ast.literal_eval(v) for r, v in c.run("seen", show=False).items()})
    assert world == script
