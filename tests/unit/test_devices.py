"""GPU planning (issue 23's CUDA-free part): which GPU each rank gets, which process group
fits, TensorPipe device maps, and a message that says what to do for each bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nbdist import devices as d


def test_gpus_flag_forms():
    assert d.parse_gpus(None) == "auto"
    assert d.parse_gpus(" NONE ") == "none"
    assert d.parse_gpus("0,2,3,5") == (0, 2, 3, 5)
    for bad in ("0,,1", "gpu0", "-1", "1,1"):
        with pytest.raises(ValueError, match="--gpus"):
            d.parse_gpus(bad)


def test_ranks_take_gpus_round_robin_by_rank():
    assert d.plan("auto", 5, 4).devices == (0, 1, 2, 3, 0)
    assert d.plan("auto", 3, 0).devices == (None, None, None)  # no CUDA: all on the CPU
    assert d.plan("none", 3, 8).devices == (None, None, None)
    assert d.plan((2, 5), 4, 8).devices == (2, 5, 2, 5)
    assert d.plan("auto", 2, 1).devices == (0, 0)  # one GPU: everyone shares it


def test_a_gpu_that_does_not_exist_is_named():
    with pytest.raises(ValueError, match="GPU 4 does not exist; this process sees GPUs 0-1"):
        d.plan((0, 4), 3, 2)
    with pytest.raises(ValueError, match="sees no GPU"):
        d.plan((0,), 2, 0)


def test_process_group_choice_and_its_messages():
    four = d.plan("auto", 4, 4)
    shared = d.plan("auto", 3, 1)
    assert d.process_group("gloo", four, True) == ("gloo", "")
    assert d.process_group(None, four, True) == (None, "")
    assert d.process_group("auto", four, True)[0] == "nccl"
    assert d.process_group("auto", shared, True) == ("gloo", "process group: gloo (ranks share "
                                                             "GPUs)")
    assert d.process_group("auto", d.plan("auto", 3, 0), False)[1].endswith("(no CUDA)")
    with pytest.raises(ValueError, match="needs CUDA.*use --process-group gloo"):
        d.process_group("nccl", d.plan("auto", 2, 0), False)
    with pytest.raises(ValueError, match="3 ranks .* share 1 GPU.*start at most 0 workers"):
        d.process_group("nccl", shared, True)
    with pytest.raises(ValueError, match="use gloo, nccl or auto"):
        d.process_group("mpi", four, True)


def test_device_maps_between_gpu_ranks():
    names = ["agent", "w1", "w2"]
    maps = d.device_maps(names, d.plan("auto", 3, 2), True)
    assert maps == {"agent": {"w1": {"cuda:0": "cuda:1"}, "w2": {"cuda:0": "cuda:0"}},
                    "w1": {"agent": {"cuda:1": "cuda:0"}, "w2": {"cuda:1": "cuda:0"}},
                    "w2": {"agent": {"cuda:0": "cuda:0"}, "w1": {"cuda:0": "cuda:1"}}}
    with pytest.raises(ValueError, match="has no GPU.*\\.cpu\\(\\)"):
        d.device_maps(names, d.plan("auto", 3, 0), False)


def test_planning_never_touches_cuda():
    """The template imports this: importing and using it must not initialise CUDA (or even
    import torch)."""
    code = ("import sys\nfrom nbdist import devices as d\n"
            "d.process_group('auto', d.plan('auto', 4, 2), True)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
