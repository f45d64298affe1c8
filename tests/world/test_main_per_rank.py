"""Issue 17: each rank has its own ``__main__``; notebook code behaves there as in a script.

Real worlds, real RPC: a notebook function runs on rank R against rank R's ``__main__``;
arriving back where it was defined it is the original object; locks and their kin travel
fresh; anything else that cannot travel is named with the chain that reached it.
"""

from __future__ import annotations

import os

import pytest
from conftest import ev

# The upstream parameter-server example's shape (pytorch/examples, distributed/rpc/
# parameter_server): a singleton behind a module-level lock, built on first use by whichever
# trainer asks first, on the parameter server (here: the notebook).
PARAMETER_SERVER = '''
import os, threading
import torch
import torch.distributed.rpc as rpc

param_server = None
global_lock = threading.Lock()

class ParameterServer:
    def __init__(self):
        self.pid = os.getpid()
        self.calls = 0
        self.weights = torch.zeros(3)

def get_parameter_server():
    global param_server
    with global_lock:
        if param_server is None:
            param_server = ParameterServer()
        param_server.calls += 1
        return param_server.pid

class TrainerNet:
    def __init__(self):
        self.ps_pid = rpc.rpc_sync("ps", get_parameter_server)

def trainer_side():
    return TrainerNet().ps_pid
'''


@pytest.fixture
def ps(ipython):
    ipython.run_line_magic("dist_start", "2 --name ps --worker-name trainer{rank}")
    assert ipython.run_cell(PARAMETER_SERVER).success
    return ipython


def test_parameter_server_singleton_lives_on_the_notebook(ps):
    lock_before = ev(ps, "id(global_lock)")
    futs = "[rpc.rpc_async(f'trainer{r}', trainer_side) for r in (1, 2) for _ in range(3)]"
    pids = ev(ps, f"[f.wait() for f in {futs}]")
    assert pids == [os.getpid()] * 6  # every trainer reached the one server, here
    assert ev(ps, "param_server.calls") == 6  # built once, by the first caller, then reused
    assert ev(ps, "type(param_server).__name__") == "ParameterServer"
    assert ev(ps, "id(global_lock)") == lock_before  # the notebook's lock was not replaced
    # each trainer has a lock of its own (fresh), and no server: it never built one
    ps.run_cell_magic("dist", "", "import threading\n"
                                  "lock_ok = isinstance(global_lock, type(threading.Lock()))\n"
                                  "no_server = param_server is None")
    check = "rpc.rpc_sync('{w}', lambda: (lock_ok, no_server, global_lock.acquire(False)))"
    for w in ("trainer1", "trainer2"):
        assert ev(ps, check.format(w=w)) == (True, True, True)


def test_worker_global_write_is_kept_and_notebook_rebinding_reaches_mirrors(ipython):
    ipython.run_line_magic("dist_start", "1 --name nb --worker-name w{rank}")
    ipython.run_cell("import torch.distributed.rpc as rpc\n"
                     "counter = 0\n"
                     "LR = 0.1\n"
                     "def bump():\n    global counter\n    counter += 1\n    return counter\n"
                     "def lr():\n    return LR\n")
    assert ev(ipython, "[rpc.rpc_sync('w1', bump) for _ in range(3)]") == [1, 2, 3]
    assert ev(ipython, "counter") == 0  # the worker wrote its own __main__, not ours
    assert ev(ipython, "rpc.rpc_sync('w1', lr)") == 0.1
    ipython.run_cell("LR = 0.5\ncounter = 100")  # a re-run cell rebinds both
    assert ev(ipython, "rpc.rpc_sync('w1', lr)") == 0.5  # a mirrored name follows the notebook
    assert ev(ipython, "rpc.rpc_sync('w1', bump)") == 4  # the worker's own binding is kept
    ipython.run_cell_magic("dist", "", "seen = (counter, LR)")
    assert ev(ipython, "rpc.rpc_sync('w1', lambda: seen)") == (4, 0.5)


def test_unchanged_global_is_not_sent_again(ipython):
    """A global the notebook did not rebind stays the worker's object between calls (so what
    the worker did to it stays, as in a script); a rebinding is sent."""
    ipython.run_line_magic("dist_start", "1 --name nb --worker-name w{rank}")
    ipython.run_cell("import torch, torch.distributed.rpc as rpc\n"
                     "BIG = torch.zeros(1000)\n"
                     "def touch():\n    BIG[0] += 1\n    return int(BIG[0]), len(BIG)\n")
    assert ev(ipython, "[rpc.rpc_sync('w1', touch) for _ in range(3)]") == [
        (1, 1000), (2, 1000), (3, 1000)]
    assert ev(ipython, "int(BIG[0])") == 0
    ipython.run_cell("BIG = torch.zeros(2000)")
    assert ev(ipython, "rpc.rpc_sync('w1', touch)") == (1, 2000)


def test_name_a_worker_cell_defined_wins_over_a_notebook_global(ipython):
    """The issue's ``trainer_pg``: a process group a ``%%dist --local`` cell made on every rank
    is used by a notebook function on each worker (the notebook's own object never travels
    over it)."""
    ipython.run_line_magic("dist_start", "2 --name nb --worker-name w{rank} "
                                         "--process-group gloo")
    ipython.run_cell_magic("dist", "--local", "import torch, torch.distributed as dist\n"
                                              "trainer_pg = dist.new_group([1, 2])\n"
                                              "ROLE = f'rank{dist.get_rank()}'")
    ipython.run_cell("import torch.distributed.rpc as rpc\n"
                     "def all_sum():\n"
                     "    t = torch.ones(1) * dist.get_rank()\n"
                     "    dist.all_reduce(t, group=trainer_pg)\n"
                     "    return ROLE, t.item()\n")
    got = ev(ipython, "[f.wait() for f in [rpc.rpc_async(f'w{r}', all_sum) for r in (1, 2)]]")
    assert got == [("rank1", 3.0), ("rank2", 3.0)]
    assert ev(ipython, "ROLE") == "rank0"


def test_code_arriving_back_where_it_was_defined_is_the_original(ipython):
    ipython.run_line_magic("dist_start", "1 --name nb --worker-name w{rank}")
    ipython.run_cell(
        "import threading, torch.distributed.rpc as rpc\n"
        "def make_counter():\n"
        "    n = [0]\n"
        "    def inc():\n        n[0] += 1\n        return n[0]\n"
        "    return inc\n"
        "inc = make_counter()\n"
        "class Registry:\n    lock = threading.Lock()\n    entries = 0\n"
        "def call_back(f):\n    return rpc.rpc_sync('nb', f)\n"
        "def echo(x):\n    return x\n")
    assert ev(ipython, "[rpc.rpc_sync('w1', call_back, args=(inc,)) for _ in range(2)]") == [1, 2]
    assert ev(ipython, "inc()") == 3  # the closure that ran was the notebook's own
    assert ev(ipython, "rpc.rpc_sync('w1', echo, args=(inc,)) is inc") is True
    ipython.run_cell("lock = Registry.lock\nRegistry.entries = 7")
    assert ev(ipython, "rpc.rpc_sync('w1', echo, args=(Registry,)) is Registry") is True
    assert ev(ipython, "Registry.lock is lock and Registry.entries == 7") is True


def test_worker_defined_function_runs_as_the_original_on_its_worker(ipython):
    ipython.run_line_magic("dist_start", "2 --name nb --worker-name w{rank}")
    ipython.run_cell_magic("dist", "--ranks 1", "hits = []\n"
                                                "def record(x):\n"
                                                "    hits.append(x)\n"
                                                "    return len(hits)\n")
    ipython.run_cell("import torch.distributed.rpc as rpc\n"
                     "record = rpc.rpc_sync('w1', lambda: record)")
    assert ev(ipython, "[rpc.rpc_sync('w1', record, args=(i,)) for i in range(3)]") == [1, 2, 3]
    assert ev(ipython, "rpc.rpc_sync('w1', lambda: list(hits))") == [0, 1, 2]
    # on another worker it is a copy against that worker's __main__ (its own ``hits``)
    assert ev(ipython, "rpc.rpc_sync('w2', record, args=(9,))") == 1


def test_sync_objects_arrive_fresh_of_the_same_kind(ipython):
    ipython.run_line_magic("dist_start", "1 --name nb --worker-name w{rank}")
    ipython.run_cell(
        "import queue, threading, multiprocessing, torch.distributed.rpc as rpc\n"
        "ev_ = threading.Event(); ev_.set()\n"
        "q = queue.Queue(maxsize=5); q.put('notebook item')\n"
        "sem = threading.BoundedSemaphore(3)\n"
        "cond = threading.Condition()\n"
        "rlock = threading.RLock(); rlock.acquire()\n"
        "mp_lock = multiprocessing.Lock()\n"
        "class Holder:\n    def __init__(self):\n        self.lock = threading.Lock()\n"
        "        self.lock.acquire()\n"
        "holder = Holder()\n"
        "def inspect():\n"
        "    return (ev_.is_set(), q.qsize(), q.maxsize, sem._value,\n"
        "            cond.acquire(False), rlock.acquire(False), mp_lock.acquire(False),\n"
        "            holder.lock.acquire(False))\n")
    assert ev(ipython, "rpc.rpc_sync('w1', inspect)") == (False, 0, 5, 3, True, True, True,
                                                          True)
    assert ev(ipython, "q.qsize(), ev_.is_set()") == (1, True)  # the notebook's are untouched
    ipython.run_cell("rlock.release()")


def test_unpicklable_global_is_named_with_the_chain_that_reached_it(ipython):
    ipython.run_line_magic("dist_start", "1 --name ps --worker-name trainer{rank}")
    ipython.run_cell(
        "import socket, torch.distributed.rpc as rpc\n"
        "server_socket = socket.socket()\n"
        "def get_parameter_server():\n    return server_socket.fileno()\n"
        "class TrainerNet:\n"
        "    def __init__(self):\n        self.fd = get_parameter_server()\n"
        "def trainer_side():\n    return TrainerNet().fd\n")
    try:
        with pytest.raises(TypeError) as info:
            ev(ipython, "rpc.rpc_sync('trainer1', trainer_side)")
        text = str(info.value)
        assert ("trainer_side -> TrainerNet.__init__ -> get_parameter_server -> server_socket"
                in text), text
        assert "trainer1" in text and "socket" in text and "%%dist" in text
        assert ev(ipython, "rpc.rpc_sync('trainer1', lambda: 42)") == 42  # the world lives on
    finally:
        ipython.run_cell("server_socket.close()")


def test_pipelined_calls_reading_a_new_global(ipython):
    """The first request carries a new binding, the next ones a marker; the callee may unpickle
    them in any order on its thread pool, and a marker waits for the value it names."""
    ipython.run_line_magic("dist_start", "1 --name nb --worker-name w{rank}")
    for k in (7, 70):
        ipython.run_cell(f"import torch.distributed.rpc as rpc\nNEWG = [{k}]\n"
                         "def use(i):\n    return i + NEWG[0]\n")
        got = ev(ipython, "[fu.wait() for fu in [rpc.rpc_async('w1', use, args=(i,)) "
                          "for i in range(200)]]")
        assert got == [i + k for i in range(200)]


# The whole upstream parameter-server program's shape, in our words: trainers reach a model on
# the server through an RRef that ``rpc.remote(get_server)`` returns (the singleton behind a
# lock), run forward through RPC, backward with distributed autograd and step a
# DistributedOptimizer over the server's parameter RRefs.
PS_TRAINING = '''
import threading
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.optim import DistributedOptimizer

def on_owner(method, rref, *args):
    return method(rref.local_value(), *args)

def call_remote(method, rref, *args):
    return rpc.rpc_sync(rref.owner(), on_owner, args=(method, rref, *args))

class Server(nn.Module):
    built = 0
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        Server.built += 1
    def forward(self, x):
        return self.net(x)
    def param_rrefs(self):
        return [rpc.RRef(p) for p in self.net.parameters()]

server = None
server_lock = threading.Lock()

def get_server():
    global server
    with server_lock:
        if server is None:
            server = Server()
        return server

class Trainer(nn.Module):
    def __init__(self):
        super().__init__()
        self.server_rref = rpc.remote("parameter_server", get_server)
    def forward(self, x):
        return call_remote(Server.forward, self.server_rref, x)

def train(seed, steps):
    torch.manual_seed(seed)
    net = Trainer()
    opt = DistributedOptimizer(torch.optim.SGD,
                               call_remote(Server.param_rrefs, net.server_rref), lr=0.05)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    losses = []
    for _ in range(steps):
        with dist_autograd.context() as cid:
            loss = F.cross_entropy(net(x), y)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
        losses.append(loss.item())
    return losses
'''


def test_upstream_parameter_server_program_trains_one_server(ipython):
    ipython.run_line_magic("dist_start", "2 --name parameter_server --worker-name trainer_{rank}")
    assert ipython.run_cell(PS_TRAINING).success
    ipython.run_cell("before = [p.detach().clone() for p in get_server().parameters()]")
    # one trainer after the other: run at once, one's in-place optimizer step can change the
    # weights another's backward still needs (the upstream program's own race)
    got = ev(ipython, "[rpc.rpc_sync(f'trainer_{r}', train, args=(r, 15)) for r in (1, 2)]")
    assert all(losses[-1] < losses[0] for losses in got), got
    assert ev(ipython, "Server.built") == 1  # one server, here, shared by both trainers
    assert ev(ipython, "all(not torch.equal(a, b) for a, b in "
                       "zip(before, server.parameters()))") is True


# The upstream distributed RNN (pytorch/examples, distributed/rpc/rnn) as its processes run
# it, in our words and on the CPU: the module's code on every rank (a ``%%dist --local``
# cell), the notebook as the parameter server ``ps``, the trainer's loop in a ``%%dist`` cell.
# The trainer's ``rpc.remote("ps", EmbeddingTable, ...)`` sends the trainer's class; on ps it
# must be ps's own ``EmbeddingTable`` (as one imported module is in a script), or
# ``super(EmbeddingTable, self)`` fails there.
RNN_MODULE = '''
import torch, torch.nn as nn
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.optim import DistributedOptimizer

def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)

def _remote_method(method, rref, *args, **kwargs):
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref] + list(args),
                        kwargs=kwargs)

def _parameter_rrefs(module):
    return [rpc.RRef(p) for p in module.parameters()]

class EmbeddingTable(nn.Module):
    built = 0
    def __init__(self, ntoken, ninp):
        super(EmbeddingTable, self).__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        EmbeddingTable.built += 1
    def forward(self, input):
        return self.encoder(input)

class Decoder(nn.Module):
    def __init__(self, ntoken, nhid):
        super().__init__()
        self.decoder = nn.Linear(nhid, ntoken)
    def forward(self, output):
        return self.decoder(output)

class RNNModel(nn.Module):
    def __init__(self, ps, ntoken, ninp, nhid, nlayers):
        super(RNNModel, self).__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp))
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid))
    def forward(self, input, hidden):
        emb = _remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        return _remote_method(Decoder.forward, self.decoder_rref, output), hidden
    def parameter_rrefs(self):
        return (_remote_method(_parameter_rrefs, self.emb_table_rref)
                + _parameter_rrefs(self.rnn)
                + _remote_method(_parameter_rrefs, self.decoder_rref))

def same(obj, name):
    return obj is globals()[name]
'''

RNN_TRAINER = '''
torch.manual_seed(0)
model = RNNModel("ps", 7, 2, 3, 2)
opt = DistributedOptimizer(torch.optim.SGD, model.parameter_rrefs(), lr=0.05)
hidden = (torch.zeros(2, 6, 3), torch.zeros(2, 6, 3))
data, target = torch.randint(0, 7, (5, 6)), torch.randint(0, 7, (5, 6))
losses = []
for _ in range(8):
    with dist_autograd.context() as cid:
        output, _ = model(data, hidden)
        loss = nn.functional.cross_entropy(output.reshape(-1, 7), target.reshape(-1))
        dist_autograd.backward(cid, [loss])
        opt.step(cid)
    losses.append(loss.item())
trained = losses[-1] < losses[0]
'''


def test_upstream_distributed_rnn_as_its_processes_run_it(ipython):
    ipython.run_line_magic("dist_start", "1 --name ps --worker-name trainer")
    ipython.run_cell_magic("dist", "--local", RNN_MODULE)
    ipython.run_cell_magic("dist", "", RNN_TRAINER)
    assert ev(ipython, "rpc.rpc_sync('trainer', lambda: trained)") is True
    assert ev(ipython, "EmbeddingTable.built") == 1  # ps's own class built the table
    # both ways, what one rank sends resolves to the other's own definitions
    for name in ("EmbeddingTable", "RNNModel", "_call_method", "same"):
        assert ev(ipython, f"rpc.rpc_sync('trainer', same, args=({name}, {name!r}))") is True
        assert ev(ipython, f"rpc.rpc_sync('trainer', lambda: {name}) is {name}") is True
    assert ev(ipython, "rpc.rpc_sync('trainer', lambda: RNNModel.forward) "
                       "is RNNModel.forward") is True


def test_a_cell_compiles_alike_on_every_rank(ipython):
    """A worker compiles a cell under the cell's own ``__future__`` flags, as IPython does in
    the notebook, never under those of nbdist's own module (annotations stay objects)."""
    ipython.run_line_magic("dist_start", "1 --name nb --worker-name w{rank}")
    ipython.run_cell_magic("dist", "--local", "import torch.distributed.rpc as rpc\n"
                                              "def typed(x: int) -> int:\n    return x\n"
                                              "ann = typed.__annotations__['x']")
    assert ev(ipython, "ann") is int
    assert ev(ipython, "rpc.rpc_sync('w1', lambda: ann is int)") is True


def test_a_twins_digest_follows_its_source_not_its_bytecode():
    """A cell compiled whole (a worker) and statement by statement (IPython) can differ in
    bytecode (``nn.Embedding(...)`` after an import in the same unit); the digest that finds a
    rank's own twin is the same for both, and differs once the source does."""
    import ast
    import linecache

    from nbdist.shipping import per_rank

    src = ("import torch.nn as nn\n"
           "class Table(nn.Module):\n"
           "    def __init__(self):\n"
           "        super(Table, self).__init__()\n"
           "        self.encoder = nn.Embedding(3, 2)\n")
    other = src.replace("(3, 2)", "(4, 2)")
    keys = {}
    try:
        for name, text, whole in (("<twin-whole>", src, True), ("<twin-parts>", src, False),
                                  ("<twin-other>", other, True)):
            linecache.cache[name] = (len(text), None, text.splitlines(True), name)
            ns: dict = {}
            tree = ast.parse(text)
            for body in ([tree.body] if whole else [[node] for node in tree.body]):
                exec(compile(ast.Module(body, []), name, "exec"), ns)
            keys[name] = per_rank.class_key(ns["Table"])
    finally:
        for name in ("<twin-whole>", "<twin-parts>", "<twin-other>"):
            linecache.cache.pop(name, None)
    assert keys["<twin-whole>"] == keys["<twin-parts>"] != keys["<twin-other>"]
