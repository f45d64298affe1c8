"""GPU worlds on a machine without one: every bad-input message, what a CPU world says and
sets, and the template that never initialises CUDA (what lets a notebook that used its GPU
start a world). The same code on a GPU: tests/world/test_gpu.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ev, start_refused

from nbdist import devices
from nbdist.patches import rpc_hooks
from nbdist.proc import cuda

NO_CUDA, ONE_GPU, TWO_GPUS = (False, 0), (True, 1), (True, 2)


@pytest.mark.parametrize("line, gpus, words", [
    ("2 --process-group nccl", NO_CUDA, "--process-group nccl needs CUDA"),
    ("2 --process-group nccl", ONE_GPU, "3 ranks (the notebook and 2 workers) would share 1 "
                                        "GPU(s), and NCCL refuses two ranks on one GPU"),
    ("2 --process-group nccl", TWO_GPUS, "start at most 1 workers"),
    ("1 --gpus 3", TWO_GPUS, "GPU 3 does not exist; this process sees GPUs 0-1"),
    ("1 --gpus 0", NO_CUDA, "sees no GPU"),
    ("1 --gpus gpu0", ONE_GPU, "--gpus takes auto, none, or a comma list"),
    ("1 --device-maps auto", NO_CUDA, "--device-maps auto maps each rank's GPU"),
    ("1 --device-maps auto --gpus none", ONE_GPU, "this world has no GPU"),
    ("1 --process-group mpi", ONE_GPU, "invalid choice"),
    ("1 --device-maps yes", ONE_GPU, "invalid choice"),
])
def test_bad_gpu_flags_say_what_to_do_and_start_nothing(ipython, monkeypatch, line, gpus,
                                                        words):
    monkeypatch.setattr(cuda, "visible", lambda: gpus)
    assert words in start_refused(ipython, line)


def test_python_api_takes_the_same_flags(world, monkeypatch):
    monkeypatch.setattr(cuda, "visible", lambda: NO_CUDA)
    with pytest.raises(ValueError, match="needs CUDA"):
        world(1, process_group="nccl")
    with pytest.raises(ValueError, match="--gpus takes"):
        world(1, gpus="first")


def test_setup_plans_local_ranks_only_and_says_what_it_chose():
    names = ["nb", "w1", "w2", "far3"]
    s = devices.setup("auto", "auto", "auto", names, local=3, visible=4, cuda=True)
    assert s.plan.devices == (0, 1, 2, None)  # a rank on another host: not this machine's GPU
    assert [s.device(r) for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", None]
    assert s.backend == "gloo" and "(a rank without a GPU)" in s.note  # far3: none here
    assert s.maps["w1"] == {"nb": {"cuda:1": "cuda:0"}, "w2": {"cuda:1": "cuda:2"}}
    local = devices.setup("auto", "auto", None, names[:3], local=3, visible=4, cuda=True)
    assert local.backend == "nccl" and local.maps == {}
    assert local.note == "GPUs: 0->cuda:0, 1->cuda:1, 2->cuda:2; process group: nccl (a GPU " \
                         "per rank)"
    cpu = devices.setup("auto", "auto", None, names, local=3, visible=0, cuda=False)
    assert cpu.plan.devices == (None,) * 4 and cpu.note == "process group: gloo (no CUDA)"
    assert devices.setup(None, None, None, names, 3, 0, False).note == ""


def test_a_cpu_world_sets_local_rank_and_the_device_and_says_gloo(ipython, capsys, monkeypatch):
    monkeypatch.setattr(cuda, "visible", lambda: NO_CUDA)  # also on a GPU machine
    ipython.run_line_magic("dist_start", "2 --process-group auto")
    assert "(process group: gloo (no CUDA))" in capsys.readouterr().out
    ipython.run_cell("import os, torch, torch.distributed as dist, nbdist\n"
                     "def where():\n"
                     "    return (os.environ['LOCAL_RANK'], str(nbdist.device()),\n"
                     "            dist.get_backend(), torch.cuda.is_initialized())")
    got = ev(ipython, "[torch.distributed.rpc.rpc_sync(f'worker{r}', where) for r in (1, 2)]")
    assert got == [("1", "cpu", "gloo", False), ("2", "cpu", "gloo", False)]
    assert str(ev(ipython, "nbdist.device()")) == "cpu"
    assert ipython.run_line_magic("dist_status", "").with_gpu is False


def test_status_shows_gpu_columns_when_ranks_have_devices():
    from nbdist.cluster.status import StatusTable

    row = {"rank": 1, "name": "w1", "pid": 7, "state": "alive", "cpu": 1.0, "mem_mb": 300.0,
           "uptime": 2.0, "alive": True, "device": "cuda:0", "gpu_mb": (12.4, 20.0),
           "gpu_util": None}
    table = StatusTable([row], with_gpu=True)
    assert table.columns[-3:] == ("gpu", "gpu MB alloc/res", "gpu util %")
    assert "cuda:0" in str(table) and "12 / 20" in str(table)


def test_a_cuda_tensor_without_device_maps_names_the_flag():
    torch_says = RuntimeError("TensorPipe RPC backend only supports CPU tensors by default, "
                              "please move your tensors to CPU before sending them over RPC")
    with pytest.raises(RuntimeError, match="--device-maps auto") as info:
        rpc_hooks._explain_cuda_tensor(torch_says)
    assert "torch said: TensorPipe" in str(info.value)
    rpc_hooks._explain_cuda_tensor(RuntimeError("something else"))  # others pass through


NEVER_CUDA = r'''
import sys, torch
calls = []
def trap(name, real):
    def call(*a, **k):
        calls.append(name)
        return real(*a, **k)
    return call
for name in ("_lazy_init", "init", "is_available", "device_count", "current_device",
             "set_device", "get_device_name", "mem_get_info"):
    setattr(torch.cuda, name, trap(name, getattr(torch.cuda, name)))
from nbdist.proc import template
template.preload()
import nbdist.join, nbdist.hosts.join_agent  # the join agents' import path
assert not calls, f"the template's preload called torch.cuda: {calls}"
assert not torch.cuda.is_initialized()
print("ok", torch.cuda.is_available())
'''


def test_template_and_join_agent_never_initialise_cuda():
    """Their import path and preload call nothing in torch.cuda (a fork of a process that
    initialised CUDA cannot use CUDA). On a GPU machine this also checks the real state."""
    out = subprocess.run([sys.executable, "-c", NEVER_CUDA], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok")
