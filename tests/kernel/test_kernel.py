"""Behaviours 2, 4, 6, 9 in a real Jupyter kernel: output routing, interrupts, exits, quiet."""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import wait_gone, wait_until

pytestmark = pytest.mark.kernel

START = "%load_ext nbdist\n%dist_start 2 --name agent --worker-name obs{rank}"
PIDS = ("[nbdist.current().worker_pids(), nbdist.cluster.session.session().template.pid, "
        "nbdist.cluster.session.session().runtime_dir]")


def _start(k) -> tuple[list[int], int, str]:
    rep = k.execute(START + "\nimport nbdist", timeout=120)
    assert rep.status == "ok", rep
    assert "3 ranks ready" in rep.stdout
    workers, template, runtime = k.value(PIDS)
    return workers, template, runtime


def test_worker_output_lands_in_the_cell_that_caused_it(kernel):
    _start(kernel)
    kernel.execute("import torch.distributed.rpc as rpc\n"
                   "def shout(i):\n    print(f'observer {i} runs an episode')\n    return i")
    rep = kernel.execute("rpc.rpc_sync('obs2', shout, args=(2,))")
    assert "[obs2] observer 2 runs an episode" in rep.stdout, rep
    # async work printing while a later cell runs shows in that later cell: `later` waits
    # until that cell has begun (it made the file), then prints
    kernel.execute("import os, tempfile\n"
                   "flag = os.path.join(tempfile.mkdtemp(), 'begun')\n"
                   "def later(flag):\n    import os, time\n"
                   "    while not os.path.exists(flag):\n        time.sleep(0.01)\n"
                   "    print('late line')\n")
    kernel.execute("rpc.rpc_async('obs1', later, args=(flag,))")
    rep = kernel.execute("import time, shutil\nopen(flag, 'w').close()\n"
                         "t0 = time.monotonic()\n"
                         "while not any('late line' in x for x in nbdist.current().logs('obs1')):\n"
                         "    assert time.monotonic() - t0 < 60, 'no late line (hangs)'\n"
                         "    time.sleep(0.02)\n"
                         "shutil.rmtree(os.path.dirname(flag))")
    assert rep.status == "ok", rep
    assert "[obs1] late line" in rep.stdout, rep


@pytest.mark.slow
def test_interrupt_during_dist_cell_and_blocking_rpc(kernel):
    _start(kernel)
    msg = kernel.send("%%dist\nimport time\nprint('looping', flush=True)\nwhile True:\n"
                      "    time.sleep(0.05)")
    _wait_for_stdout(kernel, msg, "[obs2] looping")
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    rep = kernel.collect(msg, timeout=30)
    assert time.monotonic() - t0 < 20  # from the SIGINT; the kernel asks for 2 s
    # nbdist.CellInterrupted, a KeyboardInterrupt saying where each rank stopped
    assert rep.status == "error" and rep.error["ename"] == "CellInterrupted", rep
    assert "rank 2 (obs2): KeyboardInterrupt" in "\n".join(rep.error["traceback"]), rep
    rep = kernel.execute("%%dist\n'alive'")
    assert "[obs1] 'alive'" in rep.stdout and "[obs2] 'alive'" in rep.stdout

    kernel.execute("import torch.distributed.rpc as rpc\n"
                   "def busy():\n    print('busy', flush=True)\n    while True:\n"
                   "        sum(range(100))\n")
    msg = kernel.send("rpc.rpc_sync('obs1', busy)")
    _wait_for_stdout(kernel, msg, "[obs1] busy")
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    rep = kernel.collect(msg, timeout=30)
    assert time.monotonic() - t0 < 20  # from the SIGINT; the kernel asks for 2 s
    assert rep.status == "error" and rep.error["ename"] == "KeyboardInterrupt"
    rep = kernel.execute("rpc.rpc_sync('obs1', sum, args=([1, 2],))")
    assert rep.status == "ok"


def _wait_for_stdout(kernel, msg_id: str, needle: str, timeout: float = 60) -> None:
    """Read the running cell's iopub stream until ``needle`` was printed (the cell is then
    really running on the workers); the rest of its messages are left for ``collect``."""
    import queue

    seen = []

    def arrived() -> bool:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            return False
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream"):
            seen.append(msg["content"]["text"])
        return needle in "".join(seen)

    wait_until(arrived, timeout, f"{needle!r} from the running cell")


@pytest.mark.slow
def test_workers_gone_after_stop_and_temp_files_removed(kernel):
    workers, template, runtime = _start(kernel)
    world_dirs = os.listdir(runtime)
    assert any(d.startswith("w") for d in world_dirs)
    rep = kernel.execute("%dist_stop")
    assert rep.status == "ok"
    assert wait_gone(workers, 5.0) == []
    assert not [d for d in os.listdir(runtime) if d.startswith("w")]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "restart", "shutdown"])
def test_workers_gone_when_kernel_ends(kernel, how):
    workers, template, runtime = _start(kernel)
    if how == "sigkill":
        os.kill(kernel.pid, signal.SIGKILL)
    elif how == "restart":
        kernel.km.restart_kernel(now=False)
    else:
        kernel.km.shutdown_kernel(now=False)
    t0 = time.monotonic()
    assert wait_gone([*workers, template], 30.0) == []
    # "within seconds" of the kernel's end, measured from it; 30 s above only means "hangs"
    assert time.monotonic() - t0 < 10
    wait_until(lambda: not os.path.exists(runtime), 10, f"runtime dir {runtime} removed")


@pytest.mark.slow
def test_no_torch_deprecation_noise_but_user_warnings_show(kernel):
    rep = kernel.execute("%load_ext nbdist\n%dist_start 2 --process-group gloo", timeout=120)
    assert rep.status == "ok", rep
    rep = kernel.execute(
        "import torch, torch.distributed as dist, torch.distributed.rpc as rpc\n"
        "import torch.distributed.autograd as dist_autograd\n"
        "from torch.distributed.optim import DistributedOptimizer\n"
        "p = rpc.RRef(torch.nn.Parameter(torch.ones(2)))\n"
        "opt = DistributedOptimizer(torch.optim.SGD, [p], lr=0.1)\n"
        "t = torch.ones(1)\n")
    assert rep.status == "ok", rep
    rep2 = kernel.execute("%%dist --local\nimport torch, torch.distributed as dist\n"
                          "t = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())")
    assert rep2.status == "ok", rep2
    # every worker printed its sum, prefixed, and rank 0 (--local) printed its own, bare
    assert "[worker1] sum 3.0" in rep2.stdout and "[worker2] sum 3.0" in rep2.stdout, rep2
    assert "sum 3.0" in [line.strip() for line in rep2.stdout.splitlines()], rep2
    rep3 = kernel.execute("%%dist --ranks 1\nimport warnings\nwarnings.warn('mine')")
    everything = rep.stdout + rep.stderr + rep2.stdout + rep2.stderr
    assert "ProcessGroupGloo" not in everything
    assert "TorchScript" not in everything and "deprecated" not in everything.lower()
    assert "UserWarning: mine" in rep3.stderr


@pytest.mark.slow
def test_two_notebooks_run_worlds_at_once(kernels):
    a, b = kernels(), kernels()
    ma, mb = a.send(START), b.send(START)
    ra, rb = a.collect(ma, 120), b.collect(mb, 120)
    assert ra.status == rb.status == "ok", (ra, rb)
    pids = []
    for k in (a, b):
        rep = k.execute("import nbdist, os, torch.distributed.rpc as rpc\n"
                        "print(rpc.rpc_sync('obs2', os.getpid) in "
                        "nbdist.current().worker_pids())")
        assert rep.stdout.strip() == "True", rep
        pids.append(set(k.value("nbdist.current().worker_pids()")))
    assert not pids[0] & pids[1], "the two notebooks share workers"
