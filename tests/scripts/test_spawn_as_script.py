"""Issue 33: a function run by ``mp.spawn`` from a cell starts as a spawned process does.

A script's spawned process has no RPC agent and no process group: upstream RPC examples
(pytorch/examples ``distributed/rpc/ddp_rpc``, ``rpc/rnn``, ``parameter_server``) call
``rpc.init_rpc`` in the spawned function, and the RPC+DDP tutorial makes a gloo group of two
of its processes, numbered 0 and 1, beside it. Each program below runs as a plain script under
torch's own ``mp.spawn`` (the reference) and from cells of a real kernel; what each process
prints must agree.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import free_port, listening
from kernel_helpers import Kernel, kernel_with_world

# the spawned functions, as a script would have them (PORT: a free port, set per run)
PROGRAM = """\
import os, torch, torch.distributed as dist, torch.distributed.rpc as rpc
import torch.multiprocessing as mp

def say(line):
    print(line + "\\n", end="", flush=True)  # one write: lines sharing a pipe stay whole

def rpc_run(rank, world_size):
    opts = rpc.TensorPipeRpcBackendOptions(init_method="tcp://localhost:PORT")
    say(f"{rank} starts: rpc {rpc.api._is_current_rpc_agent_set()}, "
        f"group {dist.is_initialized()}")
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    if rank == 0:
        got = [rpc.rpc_sync(f"w{r}", torch.add, args=(torch.ones(1), r)).item()
               for r in range(1, world_size)]
        say(f"0 got {got}")
    rpc.shutdown()

def pair(rank, world_size):
    say(f"{rank} starts: group {dist.is_initialized()}")
    if rank < 2:
        dist.init_process_group("gloo", rank=rank, world_size=2,
                                init_method="tcp://localhost:PORT")
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        say(f"{rank} pair sum {t.item()} of {dist.get_world_size()}")
        dist.destroy_process_group()
"""


def lines(text: str) -> list[str]:
    """The processes' own lines, without nbdist's ``[workerN] `` prefix, sorted."""
    out = []
    # torch <= 2.10's Gloo writes "[Gloo] Rank N is connected ..." on the notebook's own fd 1,
    # which the kernel forwards in the middle of the cell's stream (README, Torch versions)
    text = re.sub(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of "
                  r"connected peer ranks is : \d+\n?", "", text)
    for line in text.splitlines():
        if line.startswith("[worker"):
            line = line.split("] ", 1)[1]
        if line[:1].isdigit():
            out.append(line)
    return sorted(out)


def as_script(tmp_path, fn: str, nprocs: int) -> list[str]:
    """What the program prints run as a script under torch's own ``mp.spawn``."""
    path = tmp_path / f"{fn}_script.py"
    path.write_text(PROGRAM.replace("PORT", str(free_port())) + SCRIPT_MAIN.format(
        fn=fn, nprocs=nprocs))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return lines("".join((tmp_path / f"stdout{rank}.txt").read_text() for rank in range(nprocs)))


# each process's fd 1 goes to a file of its own: torch <= 2.10's Gloo writes its connection line
# in pieces, which processes sharing one pipe interleave past telling apart
SCRIPT_MAIN = """
def own_stdout(rank, fn, *args):
    os.dup2(os.open(f"stdout{{rank}}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    fn(rank, *args)

if __name__ == '__main__':
    mp.spawn(own_stdout, args=({fn}, {nprocs}), nprocs={nprocs})
"""


PORT = free_port()  # the kernel's


@pytest.fixture(scope="module")
def k():
    yield from kernel_with_world("%load_ext nbdist\n" + PROGRAM.replace("PORT", str(PORT)))


@pytest.fixture(autouse=True)
def stopped_after(k):
    """Each test's world ends with it (the leak guard counts its workers)."""
    yield
    k.execute("%dist_stop", timeout=60)


def ok(k: Kernel, code: str, timeout: float = 150):
    rep = k.execute(code, timeout=timeout)
    assert rep.status == "ok", (rep.stdout[-3000:], rep.stderr[-3000:], rep.error)
    return rep


def test_a_function_that_starts_rpc_itself_runs_as_in_a_script_again_and_again(k, tmp_path):
    """No world: the spawn starts a bare one (no agent, no group); the function's init_rpc,
    rpc_sync and graceful shutdown work, again in the same world, again after a
    keep-restart to more ranks (a fresh rank beside kept ones), and in a world that had RPC
    (keep-restarted bare, one line). The notebook keeps no listener of the function's store."""
    ok(k, "%dist_stop")
    rep = ok(k, "mp.spawn(rpc_run, args=(2,), nprocs=2)")
    assert "no RPC agent and no process group" in rep.stdout, rep.stdout
    assert lines(rep.stdout) == as_script(tmp_path, "rpc_run", 2), rep.stdout
    for _ in range(2):
        rep = ok(k, "mp.spawn(rpc_run, args=(2,), nprocs=2)")
        assert lines(rep.stdout) == ["0 got [2.0]", "0 starts: rpc False, group False",
                                     "1 starts: rpc False, group False"], rep.stdout
    rep = ok(k, "mp.spawn(rpc_run, args=(3,), nprocs=3)")
    assert "0 got [2.0, 3.0]" in rep.stdout and "kept state: 1" in rep.stdout, rep.stdout
    assert PORT not in [port for _, _, port in listening([k.pid])]  # its store went with it
    ok(k, "%dist_stop\n%dist_start 2")  # a world with RPC: the spawn needs it gone
    rep = ok(k, "mp.spawn(rpc_run, args=(3,), nprocs=3)")
    assert "calls rpc.init_rpc itself" in rep.stdout, rep.stdout
    assert lines(rep.stdout) == as_script(tmp_path, "rpc_run", 3), rep.stdout
    ok(k, "%%dist\nprint('cells still run')")


def _gloo_prints_on_stdout() -> bool:
    """torch <= 2.10's Gloo writes "[Gloo] Rank N is connected ..." to fd 1 of every process at
    each group join, in pieces that can land inside the processes' own lines."""
    import torch

    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) <= (2, 10)


@pytest.mark.skipif(_gloo_prints_on_stdout(), reason="torch <= 2.10: Gloo's connection lines "
                    "interleave with the printed lines this test compares (script and world)")
@pytest.mark.parametrize("start", ["--no-rpc", "--process-group gloo"])
def test_a_spawned_function_sees_no_group_of_the_world_and_the_world_gets_it_back(
        k, tmp_path, start):
    """Two of four processes make a group numbered 0 and 1 with their own init_method; none
    starts with a default group, as in a script. The world's group is back afterwards."""
    ok(k, f"%dist_stop\n%dist_start 3 {start}")
    rep = ok(k, "mp.spawn(pair, args=(4,), nprocs=4)")
    assert lines(rep.stdout) == as_script(tmp_path, "pair", 4), rep.stdout
    assert k.value("(dist.is_initialized(), dist.get_world_size())") == (True, 4)
    rep = ok(k, "%%dist --local\nt = torch.ones(1)\ndist.all_reduce(t)\n"
                "print(f'world sum {t.item()}')")  # one write: a worker's line may come
    assert rep.stdout.count("world sum 4.0") == 4, rep.stdout  # between two of rank 0's
