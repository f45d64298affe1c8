"""The programs: each one short, using ``torch.distributed`` as a script does.

A ``torchrun`` case is module-level code run by every rank (``torchrun --standalone
--nproc-per-node n`` as a script; a ``%%dist --local`` cell in a world of ``n`` ranks). A
``spawn`` case defines ``main`` and calls ``mp.spawn`` under
``if __name__ == "__main__"`` (``python prog.py`` as a script; a plain cell in a world).
``CASES`` is in run order: the world side runs them one after another in one kernel,
keep-restarting the world where the size changes and starting a new one where its flags
change (``world``) or ``fresh`` asks.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CASES", "Case", "FLAGS"]

# the flags of `%dist_start` for each kind of world; a user group's default timeout is the
# world's --rpc-timeout: 20 s bounds a case that hangs, far above what a working one takes
FLAGS = {"rpc": "--rpc-timeout 20", "pg": "--process-group gloo --rpc-timeout 20",
         "norpc": "--no-rpc --rpc-timeout 20"}


@dataclass(frozen=True)
class Case:
    name: str
    style: str  # "torchrun" or "spawn"
    n: int  # processes of the script, ranks of the world
    world: str  # a key of FLAGS
    body: str
    fresh: bool = False  # a new world (%dist_stop, %dist_start) before this case
    raises: str | None = None  # the program fails with this exception: who raised it is compared
    bound: float = 30.0  # seconds the world's cell may take
    row: str = ""  # the row of issue 33's table this case is


TR = 'RANK = int(os.environ["RANK"]); WHO = f"r{RANK}"\n'

_INIT_DESTROY = TR + '''
dist.init_process_group("gloo")
state(WHO, "after init")
print(f"rank {dist.get_rank()} of {dist.get_world_size()}")
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t)
record(WHO, "all_reduce", t.tolist())
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_TWICE = '''
def main(rank, world_size):
    for round, port in enumerate((PORT, PORT2)):
        dist.init_process_group("gloo", init_method=f"tcp://localhost:{port}", rank=rank,
                                world_size=world_size)
        t = torch.tensor([float(rank * 10 + round)]); dist.all_reduce(t)
        record(f"p{rank}", f"round {round}", t.tolist())
        dist.destroy_process_group()
        state(f"p{rank}", f"after destroy {round}")


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
'''

_ENV = TR + '''
for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "ROLE_RANK", "ROLE_WORLD_SIZE"):
    record(WHO, name, os.environ.get(name))
record(WHO, "MASTER_ADDR set", "MASTER_ADDR" in os.environ)
record(WHO, "MASTER_PORT set", "MASTER_PORT" in os.environ)
'''

_COLLECTIVES = TR + '''
dist.init_process_group("gloo")
n = dist.get_world_size()
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t); record(WHO, "all_reduce sum", t.tolist())
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t, op=dist.ReduceOp.MAX)
record(WHO, "all_reduce max", t.tolist())
t = torch.tensor([float(RANK)] * 2); dist.broadcast(t, src=1); record(WHO, "broadcast", t.tolist())
out = [torch.zeros(1) for _ in range(n)]; dist.all_gather(out, torch.tensor([RANK * 2.0]))
record(WHO, "all_gather", [x.item() for x in out])
t = torch.tensor([RANK + 1.0]); dist.reduce(t, dst=0)
record(WHO, "reduce", t.tolist() if RANK == 0 else None)
out = [None] * n; dist.all_gather_object(out, {"rank": RANK}); record(WHO, "all_gather_object", out)
objs = [f"from {RANK}"]; dist.broadcast_object_list(objs, src=2)
record(WHO, "broadcast_object_list", objs)
if RANK == 0:
    dist.send(torch.tensor([42.0]), dst=1)
elif RANK == 1:
    t = torch.zeros(1); dist.recv(t, src=0); record(WHO, "recv", t.tolist())


def reduce_scatter():
    out = torch.zeros(1)
    dist.reduce_scatter(out, [torch.tensor([float(RANK + i)]) for i in range(n)])
    return out.tolist()


attempt(WHO, "reduce_scatter", reduce_scatter)
dist.barrier()
dist.destroy_process_group()
'''

_NEW_GROUP = TR + '''
dist.init_process_group("gloo")
g = dist.new_group([0, 2])
record(WHO, "members", dist.get_process_group_ranks(g) if RANK in (0, 2) else None)
record(WHO, "rank in group", dist.get_rank(g))
record(WHO, "size of group", dist.get_world_size(g) if RANK in (0, 2) else None)
record(WHO, "backend of group", str(dist.get_backend(g)) if RANK in (0, 2) else None)
if RANK in (0, 2):
    t = torch.tensor([RANK + 1.0]); dist.all_reduce(t, group=g)
    record(WHO, "all_reduce in group", t.tolist())
dist.destroy_process_group(g) if RANK in (0, 2) else None
state(WHO, "after destroying the subgroup")
t = torch.ones(1); dist.all_reduce(t); record(WHO, "default group still works", t.tolist())
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_SUBGROUPS = TR + '''
dist.init_process_group("gloo")
cur, groups = dist.new_subgroups(group_size=2)
record(WHO, "subgroup ranks", dist.get_process_group_ranks(cur))
record(WHO, "subgroups", len(groups))
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t, group=cur)
record(WHO, "all_reduce in subgroup", t.tolist())
cur, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
record(WHO, "enumerated subgroup", dist.get_process_group_ranks(cur))
record(WHO, "backend of subgroup", str(dist.get_backend(cur)))
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_INIT_DEVICE_MESH = TR + '''
from torch.distributed.device_mesh import init_device_mesh
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
state(WHO, "after init_device_mesh")
record(WHO, "mesh", mesh.mesh.tolist())
record(WHO, "coordinate", mesh.get_coordinate())
for dim in ("dp", "tp"):
    g = mesh.get_group(dim)
    record(WHO, f"{dim} ranks", dist.get_process_group_ranks(g))
    t = torch.tensor([RANK + 1.0]); dist.all_reduce(t, group=g)
    record(WHO, f"{dim} all_reduce", t.tolist())
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_DEVICE_MESH = TR + '''
from torch.distributed.device_mesh import DeviceMesh
dist.init_process_group("gloo")
mesh = DeviceMesh("cpu", [[0, 1], [2, 3]])
record(WHO, "coordinate", mesh.get_coordinate())
g = mesh.get_group(1)
record(WHO, "row ranks", dist.get_process_group_ranks(g))
t = torch.tensor([RANK * 1.0]); dist.all_reduce(t, group=g)
record(WHO, "row all_reduce", t.tolist())
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_BARRIER = TR + '''
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
dist.barrier()
record(WHO, "barrier", "passed")
dist.monitored_barrier(timeout=timedelta(seconds=20))
record(WHO, "monitored_barrier", "passed")
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_INIT_TIMEOUT = '''
def main(rank, world_size):
    if rank == 0:
        attempt("p0", "init without the peer", lambda: dist.init_process_group(
            "gloo", init_method=f"tcp://localhost:{PORT}", rank=0, world_size=2,
            timeout=timedelta(seconds=2)))
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
'''

_SETUP = '''
def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
'''

_TUTORIAL_SPAWN = _SETUP + '''

def demo_basic(rank, world_size):
    setup(rank, world_size)
    state(f"p{rank}", "after setup")
    if rank == 0:
        record("p0", "port open", port_open(PORT))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.full((3, 4), rank + 1.0)).sum().backward()
    record(f"p{rank}", "grad", [round(x, 4) for x in model.weight.grad.flatten().tolist()])
    dist.destroy_process_group()
    state(f"p{rank}", "after cleanup")


if __name__ == "__main__":
    for _ in range(2):
        mp.spawn(demo_basic, args=(2,), nprocs=2, join=True)
    state("parent", "after spawns")
'''

_SPAWN_NO_JOIN = '''
def main(rank, world_size):
    dist.init_process_group("gloo", init_method=f"tcp://localhost:{PORT}", rank=rank,
                            world_size=world_size)
    t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
    record(f"p{rank}", "all_reduce", t.tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = mp.spawn(main, args=(2,), nprocs=2, join=False)
    record("parent", "context", isinstance(ctx, mp.ProcessContext))
    done = False
    for _ in range(600):
        done = ctx.join(timeout=0.1)
        if done:
            break
    record("parent", "joined", done)
    state("parent", "after join")
'''

_SPAWN_RAISES = '''
def main(rank, world_size):
    if rank == 2:
        raise ValueError("rank 2 gives up")
    record(f"p{rank}", "ran", True)


if __name__ == "__main__":
    try:
        mp.spawn(main, args=(3,), nprocs=3)
    except mp.ProcessRaisedException as e:
        record("parent", "raised", {"error_index": e.error_index,
                                    "names ValueError": "ValueError: rank 2 gives up" in str(e)})
    state("parent", "after the raising spawn")
'''

_SPAWN_RAISES_IN_INIT = _SETUP + '''

def main(rank, world_size):
    if rank == 1:
        raise KeyError("no data")
    setup(rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        mp.spawn(main, args=(2,), nprocs=2)
    except mp.ProcessRaisedException as e:
        record("parent", "raised", {"error_index": e.error_index,
                                    "names KeyError": "KeyError" in str(e)})
    state("parent", "after the raising spawn")
'''

_DDP_RPC_SPAWN = '''
def main(rank, world_size):
    if rank in (1, 2):
        dist.init_process_group(backend="gloo", rank=rank - 1, world_size=2,
                                init_method=f"tcp://localhost:{PORT}")
        state(f"p{rank}", "trainer group")
        t = torch.tensor([float(rank)]); dist.all_reduce(t)
        record(f"p{rank}", "all_reduce", t.tolist())
        dist.destroy_process_group()
        state(f"p{rank}", "after")
    else:
        state(f"p{rank}", "without init")


if __name__ == "__main__":
    mp.spawn(main, args=(4,), nprocs=4)
'''

_DESTROY_AT_END = TR + '''
# the tutorials' main(): init, work, destroy_process_group() at the end
dist.init_process_group("gloo")
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t); record(WHO, "all_reduce", t.tolist())
dist.destroy_process_group()
record(WHO, "is_initialized after destroy", dist.is_initialized())
attempt(WHO, "get_rank after destroy", dist.get_rank)
'''

_TWO_OF_THREE = '''
def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def main(rank, world_size):
    setup(rank, world_size, PORT)
    dist.destroy_process_group()
    if rank < 2:
        setup(rank, 2, PORT2)
        state(f"p{rank}", "group of 2")
        t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
        record(f"p{rank}", "all_reduce", t.tolist())
        dist.destroy_process_group()
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(3,), nprocs=3)
'''

_OTHER_SIZE_BACKEND = '''
def main(rank, world_size):
    dist.init_process_group("gloo", init_method=f"tcp://localhost:{PORT}", rank=rank,
                            world_size=world_size)
    dist.destroy_process_group()
    if rank in (1, 2):
        dist.init_process_group(backend="cpu:gloo", rank=rank - 1, world_size=2,
                                init_method=f"tcp://127.0.0.1:{PORT2}")
        state(f"p{rank}", "group of 2, another backend string")
        out = [torch.zeros(1) for _ in range(2)]; dist.all_gather(out, torch.tensor([float(rank)]))
        record(f"p{rank}", "all_gather", [x.item() for x in out])
        dist.destroy_process_group()
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(3,), nprocs=3)
'''

_NEW_GROUP_02 = TR + '''
dist.init_process_group("gloo")
g = dist.new_group([0, 2])
if RANK in (0, 2):
    t = torch.tensor([RANK + 1.0]); dist.all_reduce(t, group=g)
    record(WHO, "all_reduce in [0, 2]", t.tolist())
    record(WHO, "rank in group", dist.get_rank(g))
else:
    record(WHO, "rank in group", dist.get_rank(g))
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_NO_DESTROY = TR + '''
# torchrun-style code that never destroys its group: the process ends, and the group with it
dist.init_process_group("gloo")
state(WHO, "after init")
t = torch.tensor([RANK * 1.0]); dist.all_reduce(t); record(WHO, "all_reduce", t.tolist())
'''

_SOME_DESTROY = TR + '''
# as the master of torch's DDP-under-RPC test: every rank but the last destroys its group
dist.init_process_group("gloo")
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t); record(WHO, "all_reduce", t.tolist())
if RANK != int(os.environ["WORLD_SIZE"]) - 1:
    dist.destroy_process_group()
state(WHO, "at the end")
'''

_RAISE_AT_ONCE = TR + '''
if RANK != 0:
    not_defined_on_this_rank()
dist.init_process_group("gloo")
dist.destroy_process_group()
'''

_INIT_TWICE_ERROR = TR + '''
dist.init_process_group("gloo")
attempt(WHO, "init again without destroy", lambda: dist.init_process_group("gloo"))
state(WHO, "still")
dist.destroy_process_group()
attempt(WHO, "destroy when none", dist.destroy_process_group)
state(WHO, "after destroy")
'''

_SIZE_TOO_LARGE = '''
def main(rank, world_size):
    attempt(f"p{rank}", "rank beyond world_size", lambda: dist.init_process_group(
        "gloo", rank=rank + 5, world_size=2, init_method=f"tcp://localhost:{PORT}",
        timeout=timedelta(seconds=3)))
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(2,), nprocs=2)
'''

_GROUP_OF_FIRST = '''
def main(rank, world_size):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", str(PORT)
    if rank < 2:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        if rank == 0:
            record("p0", "port open", port_open(PORT))
        t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
        record(f"p{rank}", "all_reduce", t.tolist())
        dist.destroy_process_group()
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(3,), nprocs=3)
'''

_FILE_INIT = TR + '''
dist.init_process_group("gloo", init_method="file://" + os.path.join(os.environ["CONF_OUT"], "s"),
                        rank=RANK, world_size=int(os.environ["WORLD_SIZE"]))
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t); record(WHO, "all_reduce", t.tolist())
dist.destroy_process_group()
state(WHO, "after destroy")
'''

_SUBGROUP_OF_USER_GROUP = '''
# a group numbered from 0 on ranks 1..3, then a subgroup over it
def main(rank, world_size):
    if rank > 0:
        dist.init_process_group("gloo", rank=rank - 1, world_size=3,
                                init_method=f"tcp://localhost:{PORT}")
        g = dist.new_group([0, 2])
        inside = dist.get_rank() in (0, 2)
        if inside:
            t = torch.tensor([rank * 1.0]); dist.all_reduce(t, group=g)
            record(f"p{rank}", "all_reduce in [0, 2]", t.tolist())
        record(f"p{rank}", "backend of group", str(dist.get_backend(g)) if inside else None)
        dist.destroy_process_group()
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(4,), nprocs=4)
'''

_MESH_OVER_USER_GROUP = '''
from torch.distributed.device_mesh import init_device_mesh


def main(rank, world_size):
    if rank in (1, 2):
        saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(PORT), RANK=str(rank - 1),
                          WORLD_SIZE="2")
        mesh = init_device_mesh("cpu", (2,))
        record(f"p{rank}", "mesh", mesh.mesh.tolist())
        t = torch.tensor([rank * 1.0]); dist.all_reduce(t, group=mesh.get_group())
        record(f"p{rank}", "all_reduce", t.tolist())
        dist.destroy_process_group()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    state(f"p{rank}", "after")


if __name__ == "__main__":
    mp.spawn(main, args=(4,), nprocs=4)
'''

_STATE_AFTER = TR + '''
# a new world after a failure: every rank makes the group and uses it
dist.init_process_group("gloo")
state(WHO, "after init")
t = torch.tensor([RANK + 1.0]); dist.all_reduce(t); record(WHO, "all_reduce", t.tolist())
dist.destroy_process_group()
state(WHO, "after destroy")
'''

CASES: list[Case] = [
    # a world with RPC (the default), sizes changed by keep-restarts
    Case("torchrun_env", "torchrun", 3, "rpc", _ENV),  # first: later programs set MASTER_*
    Case("init_destroy_env", "torchrun", 2, "rpc", _INIT_DESTROY),
    Case("init_destroy_twice", "spawn", 2, "rpc", _TWICE),
    Case("tutorial_setup_cleanup_spawn", "spawn", 2, "rpc", _TUTORIAL_SPAWN),
    Case("spawn_join_false", "spawn", 2, "rpc", _SPAWN_NO_JOIN),
    Case("init_timeout_without_peer", "spawn", 2, "rpc", _INIT_TIMEOUT),
    Case("collectives", "torchrun", 3, "rpc", _COLLECTIVES),
    Case("new_group_0_2", "torchrun", 3, "rpc", _NEW_GROUP),
    Case("barrier", "torchrun", 3, "rpc", _BARRIER),
    Case("init_twice_is_an_error", "torchrun", 3, "rpc", _INIT_TWICE_ERROR),
    Case("rank_beyond_world_size", "spawn", 2, "rpc", _SIZE_TOO_LARGE),
    Case("group_of_the_first_two", "spawn", 3, "rpc", _GROUP_OF_FIRST),
    Case("file_init_method", "torchrun", 3, "rpc", _FILE_INIT),
    Case("spawn_raises", "spawn", 3, "rpc", _SPAWN_RAISES),
    Case("destroy_then_other_size_and_backend", "spawn", 3, "rpc", _OTHER_SIZE_BACKEND),
    Case("spawn_raises_while_a_peer_inits", "spawn", 2, "rpc", _SPAWN_RAISES_IN_INIT, bound=5.0),
    Case("ddp_rpc_trainers_group_spawn", "spawn", 4, "rpc", _DDP_RPC_SPAWN, row="3"),
    Case("subgroups", "torchrun", 4, "rpc", _SUBGROUPS),
    Case("init_device_mesh", "torchrun", 4, "rpc", _INIT_DEVICE_MESH),
    Case("device_mesh", "torchrun", 4, "rpc", _DEVICE_MESH),
    Case("new_group_of_a_user_group", "spawn", 4, "rpc", _SUBGROUP_OF_USER_GROUP),
    Case("device_mesh_of_a_user_group", "spawn", 4, "rpc", _MESH_OVER_USER_GROUP),
    Case("ranks_raise_while_rank0_inits", "torchrun", 4, "rpc", _RAISE_AT_ONCE,
         raises="NameError", bound=5.0, row="4"),
    # a world with its own process group: the first is row 5's next world, in the same kernel
    Case("next_world_forms_its_group", "torchrun", 4, "pg", _STATE_AFTER, fresh=True,
         bound=5.0, row="5"),
    Case("pg_destroy_at_end_of_main", "torchrun", 3, "pg", _DESTROY_AT_END, row="1"),
    Case("pg_destroy_then_two_of_three", "spawn", 3, "pg", _TWO_OF_THREE, row="2"),
    Case("pg_new_group_0_2", "torchrun", 3, "pg", _NEW_GROUP_02, row="6"),
    Case("pg_no_destroy", "torchrun", 3, "pg", _NO_DESTROY),
    Case("pg_after_no_destroy", "torchrun", 3, "pg", _INIT_DESTROY),
    Case("pg_some_destroy", "torchrun", 3, "pg", _SOME_DESTROY),
    Case("pg_after_some_destroy", "torchrun", 3, "pg", _INIT_DESTROY),
    Case("pg_collectives", "torchrun", 3, "pg", _COLLECTIVES),
    Case("pg_tutorial_setup_cleanup_spawn", "spawn", 2, "pg", _TUTORIAL_SPAWN),
    Case("pg_ddp_rpc_trainers_group", "spawn", 4, "pg", _DDP_RPC_SPAWN, row="3"),
    Case("pg_init_device_mesh", "torchrun", 4, "pg", _INIT_DEVICE_MESH),
    # a world without RPC
    Case("norpc_destroy_at_end_of_main", "torchrun", 3, "norpc", _DESTROY_AT_END, row="1"),
    Case("norpc_destroy_then_two_of_three", "spawn", 3, "norpc", _TWO_OF_THREE, row="2"),
    Case("norpc_collectives", "torchrun", 3, "norpc", _COLLECTIVES),
    Case("norpc_some_destroy", "torchrun", 3, "norpc", _SOME_DESTROY),
    Case("norpc_after_some_destroy", "torchrun", 3, "norpc", _INIT_DESTROY),
    Case("norpc_spawn_raises", "spawn", 3, "norpc", _SPAWN_RAISES),
    Case("norpc_subgroups", "torchrun", 4, "norpc", _SUBGROUPS),
]
