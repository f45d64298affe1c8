"""Issue 27, items 2-4: the DDP tutorial's ``setup()``/``cleanup()`` and torchrun's environment
in a world. Real worlds (this process is rank 0, as a notebook is), real Gloo groups.

``init_process_group`` with ``env://``, ``tcp://`` or ``file://`` joins the world's private
rendezvous (no port, no file); everything else is as in a script (issue 33): a world's own
group is lent to a call that asks for it and ended by the user's destroy; a subset of the
world numbered from 0 meets at its own rendezvous; only what torch refuses is refused (and a
group larger than the world); demo after demo works;
``RANK``/``WORLD_SIZE``/... are set on every rank and the notebook gets its own back at stop.
The destroy-then-free stress in a real kernel is in ``test_tutorial_freeze.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from conftest import listening

import nbdist
from nbdist.errors import DistCellError

TUTORIAL = '''
import os, torch, torch.distributed as dist, torch.nn as nn, torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

def cleanup():
    dist.destroy_process_group()

class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))

def demo_basic(rank, world_size):
    setup(rank, world_size)
    model = ToyModel()
    ddp_model = DDP(model)
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    nn.MSELoss()(ddp_model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
    optimizer.step()
    cleanup()
    return round(sum(p.sum().item() for p in model.parameters()), 5)
'''

RANK = "int(os.environ['RANK'])"


MESH = """\
import os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
me = 3 - int(os.environ['RANK'])  # numbered the other way round from the world
dist.init_process_group('gloo', init_method='tcp://localhost:29500', rank=me, world_size=4)
pair = dist.new_group([0, 2])
t = torch.tensor([float(me)])
if me in (0, 2):
    dist.all_reduce(t, group=pair)
sub, subs = dist.new_subgroups(2)
s = torch.tensor([float(me)])
dist.all_reduce(s, group=sub)
mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp'))
m = torch.tensor([float(me)])
dist.all_reduce(m, group=mesh.get_group('dp'))
seen = (me, t.item(), s.item(), m.item(), mesh.get_local_rank('dp'))
dist.destroy_process_group()
del pair, sub, subs, mesh
"""


def _local(ipython, code: str) -> None:
    ipython.run_cell_magic("dist", "--local", code)


@pytest.fixture(autouse=True, scope="module")
def ddp_warm():
    """One DDP demo and one device mesh in this process before the tests: DDP, Gloo and the
    mesh open some handles once per process (event fds, a pipe, a socket), which the leak
    guard must not count as a test's."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    ip.run_line_magic("dist_start", "3")
    try:
        _local(ip, TUTORIAL)
        _local(ip, f"demo_basic({RANK}, 4)")
        _local(ip, MESH)
    finally:
        nbdist.stop()
    yield


def test_env_tcp_and_file_init_methods_join_the_world_without_a_port(ipython, capsys,
                                                                      tmp_path):
    ipython.run_line_magic("dist_start", "2")
    c = nbdist.current()
    pids = [os.getpid(), *c.worker_pids()]
    before = {port for _, _, port in listening(pids)}
    capsys.readouterr()
    methods = [None, "tcp://127.0.0.1:12355", f"file://{tmp_path}/rendezvous"]
    for i, method in enumerate(methods):
        _local(ipython, "import os, torch, torch.distributed as dist\n"
                        f"dist.init_process_group('gloo', init_method={method!r}, "
                        f"rank={RANK}, world_size=3)\n"
                        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
                        "dist.all_reduce(t)\n")
        ours = listening(pids)
        assert all(port != 12355 for _, _, port in ours), ours
        assert all(ip == "127.0.0.1" for _, ip, port in ours if port not in before), ours
        _local(ipython, "dist.destroy_process_group()\nt.item()")
        out = capsys.readouterr()
        assert "[worker1] 6.0" in out.out and "[worker2] 6.0" in out.out, out
        assert ipython.user_ns["t"].item() == 6.0
        lines = out.err.count("no port is opened")
        assert lines == (1 if i == 0 else 0), out.err  # once per world
        assert not dist.is_initialized()
    assert not os.path.exists(tmp_path / "rendezvous")  # file:// was not used either
    assert c.run("dist.is_initialized()", show=False) == {1: "False", 2: "False"}


def test_the_tutorial_demo_runs_again_and_again_with_equal_weights(ipython, capsys):
    ipython.run_line_magic("dist_start", "1")
    _local(ipython, TUTORIAL)
    c = nbdist.current()
    for _ in range(3):
        _local(ipython, f"w = demo_basic({RANK}, 2)")
        assert c.run("w", show=False)[1] == repr(ipython.user_ns["w"])
    assert c.run("x = torch.ones(1)\nx", show=False)  # the world goes on
    assert "no port is opened" in capsys.readouterr().err
    # a group left open is ended by a keep-restart; the kept worker joins the next demo
    _local(ipython, f"dist.init_process_group('gloo', rank={RANK}, world_size=2)")
    c.restart(1, keep=True, quiet=True)
    assert not dist.is_initialized() and c.run("dist.is_initialized()", show=False) == {
        1: "False"}
    _local(ipython, f"w = demo_basic({RANK}, 2)")
    assert c.run("w", show=False)[1] == repr(ipython.user_ns["w"])


def test_a_function_run_on_every_rank_over_rpc_joins_a_group(ipython):
    ipython.run_line_magic("dist_start", "2")
    assert ipython.run_cell(TUTORIAL).success  # demo_basic lives in this "notebook" only
    code = ("import torch.distributed.rpc as rpc\n"
            "futs = [rpc.rpc_async(f'worker{r}', demo_basic, args=(r, 3)) for r in (1, 2)]\n"
            "here = demo_basic(0, 3)\n"
            "there = [f.wait() for f in futs]")
    for _ in range(2):  # and again
        assert ipython.run_cell(code).success
        assert ipython.user_ns["there"] == [ipython.user_ns["here"]] * 2
    assert not dist.is_initialized()


@pytest.mark.parametrize("flags", ["--process-group gloo", "--no-rpc"])
def test_a_world_with_its_own_group_lends_it_and_the_users_destroy_ends_it(ipython, capsys,
                                                                          flags):
    ipython.run_line_magic("dist_start", f"1 {flags}")
    c = nbdist.current()
    _local(ipython, "import torch, torch.distributed as dist\n"
                    "t = torch.ones(1)\ndist.all_reduce(t)\nt.item()")  # the world's group
    assert "[worker1] 2.0" in capsys.readouterr().out
    _local(ipython, TUTORIAL)
    _local(ipython, f"w = demo_basic({RANK}, 2)")  # torchrun-style init takes the world's group
    assert "takes this world's own process group" in capsys.readouterr().err
    # cleanup() ended it, as in a script: no default group on any rank
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="has not been initialized"):
        dist.get_rank()
    assert c.run("dist.is_initialized()", show=False) == {1: "False"}
    for _ in range(2):  # the tutorial's loop goes on, with groups of its own
        _local(ipython, f"w = demo_basic({RANK}, 2)")
        assert c.run("w", show=False)[1] == repr(ipython.user_ns["w"])
    dist.init_process_group("gloo", rank=0, world_size=1)  # another size: the notebook alone
    t = torch.ones(2)
    dist.all_reduce(t)
    assert (dist.get_world_size(), t.tolist()) == (1, [1.0, 1.0])
    with pytest.raises(ValueError, match="twice"):  # torch's own error, as in a script
        dist.init_process_group("gloo", rank=0, world_size=1)
    dist.destroy_process_group()
    with pytest.raises(AssertionError):  # torch's, for a destroy with nothing to destroy
        dist.destroy_process_group()


def test_another_group_ends_the_worlds_own_on_its_members_only(ipython, capsys):
    ipython.run_line_magic("dist_start", "2 --process-group gloo")
    c = nbdist.current()
    world_group = dist.group.WORLD
    # ranks 0 and 1 form a group of 2 numbered the other way round, as a script's two
    # processes could; rank 2 keeps the world's group
    ipython.run_cell_magic("dist", "--local --ranks 1", "import torch.distributed as dist\n"
                           "dist.init_process_group('gloo', rank=1 - dist.get_rank(), "
                           "world_size=2)\nr = dist.get_rank()")
    assert dist.is_initialized() and dist.group.WORLD is not world_group
    assert (dist.get_rank(), dist.get_world_size()) == (1, 2)
    assert c.run("(r, dist.get_world_size())", ranks=[1], show=False) == {1: "(0, 2)"}
    assert c.run("import torch.distributed as dist\n(dist.get_rank(), dist.get_world_size())",
                 ranks=[2], show=False) == {
        2: "(2, 3)"}
    ipython.run_cell_magic("dist", "--local --ranks 1", "dist.destroy_process_group()")
    assert not dist.is_initialized()


def test_a_subset_of_the_world_numbered_from_0_meets_at_its_own_rendezvous(ipython):
    """pytorch/examples distributed/rpc/ddp_rpc: two trainers of four RPC ranks form a Gloo
    group of their own with ``init_method="tcp://localhost:29500"``."""
    ipython.run_line_magic("dist_start", "3")
    c = nbdist.current()
    pids = [os.getpid(), *c.worker_pids()]
    code = ("import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', init_method='tcp://localhost:29500', "
            "rank=dist_rank - 2, world_size=2)\n"
            "t = torch.tensor([float(dist.get_rank() + 1)])\ndist.all_reduce(t)\n"
            "(dist.get_rank(), dist.get_world_size(), t.item())")
    for _ in range(2):  # and again, under fresh keys
        out = c.run(code.replace("dist_rank", "int(__import__('os').environ['RANK'])"),
                    ranks=[2, 3], show=False)
        assert out == {2: "(0, 2, 3.0)", 3: "(1, 2, 3.0)"}
        assert all(port != 29500 for _, _, port in listening(pids))
        c.run("dist.destroy_process_group()", ranks=[2, 3], show=False)
    assert not dist.is_initialized()


def test_only_what_torch_refuses_is_refused(ipython):
    ipython.run_line_magic("dist_start", "1")
    c = nbdist.current()
    with pytest.raises(ValueError, match=r"world_size=5\).*of this nbdist world of 2"):
        dist.init_process_group("gloo", rank=0, world_size=5)  # could never meet
    # rank 1 of a group of one: a script's store client waits for rank 0's store until the
    # timeout, then torch raises DistNetworkError; so does the world's rendezvous
    with pytest.raises(DistCellError, match="DistNetworkError.*rank 1 waited 2s for rank 0"):
        c.run("import datetime, torch.distributed as dist\n"
              "dist.init_process_group('gloo', rank=1, world_size=1, "
              "timeout=datetime.timedelta(seconds=2))", show=False)
    assert not dist.is_initialized()
    dist.init_process_group("gloo", rank=0, world_size=1)  # a group of one: fine
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    assert t.tolist() == [1.0, 1.0]
    assert c.run("dist.is_initialized()", show=False) == {1: "False"}


ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "ROLE_WORLD_SIZE")
READ_ENV = f"import os\n[os.environ.get(k) for k in {ENV_KEYS!r}]"


def _env(size: int, rank: int) -> list[str]:
    return [str(rank), str(size), str(rank), str(size), "0", str(rank), str(size)]


def test_torchrun_environment_on_every_rank_through_restarts_and_back_after_stop(world,
                                                                                 monkeypatch):
    monkeypatch.setenv("RANK", "user's")
    monkeypatch.setenv("MASTER_PORT", "12355")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    master = ("MASTER_ADDR", "MASTER_PORT")
    saved = {k: os.environ.get(k) for k in (*ENV_KEYS, *master)}
    c = world(2)
    for size in (3, 4, 2):  # start, restart, keep-restart (grow, then shrink)
        assert [os.environ.get(k) for k in ENV_KEYS] == _env(size, 0)
        values = c.run(READ_ENV, show=False)
        assert {r: eval(v) for r, v in values.items()} == {r: _env(size, r)  # noqa: S307
                                                         for r in range(1, size)}
        # torchrun's MASTER_ADDR/MASTER_PORT: the same on every rank, a port nothing holds
        here = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
        assert here[0] == "127.0.0.1" and here[1] != "12355", here
        got = c.run(f"import os\n[os.environ.get(k) for k in {master!r}]", show=False)
        assert {tuple(eval(v)) for v in got.values()} == {here}  # noqa: S307
        pids = [os.getpid(), *c.worker_pids()]
        assert int(here[1]) not in {port for _, _, port in listening(pids)}
        if size == 3:
            c = c.restart(3)
        elif size == 4:
            c.restart(1, keep=True)
    c.stop()
    assert {k: os.environ.get(k) for k in (*ENV_KEYS, *master)} == saved  # absent: removed


def test_new_group_subgroups_and_a_device_mesh_over_a_group_of_its_own_numbering(ipython):
    ipython.run_line_magic("dist_start", "3")
    c = nbdist.current()
    _local(ipython, MESH)
    seen = {0: ipython.user_ns["seen"]}
    seen.update({r: eval(v) for r, v in c.run("seen", show=False).items()})  # noqa: S307
    # me = 3 - rank; pair {0,2} sums to 2; subgroups {0,1} -> 1, {2,3} -> 5;
    # mesh dp groups {0,2} -> 2 and {1,3} -> 4
    expected = {3: (0, 2.0, 1.0, 2.0, 0), 2: (1, 1.0, 1.0, 4.0, 0),
                1: (2, 2.0, 5.0, 2.0, 1), 0: (3, 3.0, 5.0, 4.0, 1)}
    assert seen == expected
    assert not dist.is_initialized()


def test_a_failed_attempt_takes_its_arrival_back_and_the_next_group_forms(ipython):
    """Members join generations at a rendezvous to agree on fresh keys: an attempt that
    timed out (torch's error type, as a script's) ends its generation, and the next group
    forms in a fresh one."""
    from datetime import timedelta

    ipython.run_line_magic("dist_start", "1")
    with pytest.raises(dist.DistStoreError, match=r"rank 0 \(worker0\) waited 1s"):
        dist.init_process_group("gloo", rank=0, world_size=2, timeout=timedelta(seconds=1))
    assert not dist.is_initialized()
    _local(ipython, "import os, torch, torch.distributed as dist\n"
                    f"dist.init_process_group('gloo', rank={RANK}, world_size=2, "
                    "timeout=__import__('datetime').timedelta(seconds=20))\n"
                    "t = torch.ones(1)\ndist.all_reduce(t)\ndist.destroy_process_group()\n")
    assert ipython.user_ns["t"].item() == 2.0
