"""bench/cells/spmd.py (issue 19, item 5): its summary and its training code (its ``--smoke`` run is
tests/benchmarks/test_bench_smoke.py's, with every other bench script)."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path[:0] = [str(ROOT / "bench" / "cells"), str(ROOT / "bench")]
import spmd  # noqa: E402


def test_summary_takes_nbdist_cold_round_apart_and_medians_the_rest():
    rounds = [
        {"kind": "nbdist", "first_step_s": 9.0, "step_times": [0.010, 0.012]},
        {"kind": "torchrun", "first_step_s": 6.0, "step_times": [0.010, 0.010]},
        {"kind": "torchrun", "first_step_s": 8.0, "step_times": [0.011]},
        {"kind": "nbdist", "first_step_s": 2.0, "step_times": [0.011]},
        {"kind": "nbdist", "first_step_s": 4.0, "step_times": [0.011]},
    ]
    s = spmd.summarize(rounds)
    assert s["nbdist"]["first_step_cold_s"] == 9.0 and s["nbdist"]["first_step_s"] == 3.0
    assert s["torchrun"]["first_step_s"] == 7.0 and s["torchrun"]["first_step_cold_s"] is None
    assert s["nbdist"]["step_ms"] == pytest.approx(11.0)
    assert s["torchrun"]["step_ms"] == pytest.approx(10.0)
    assert s["ratio_first_step"] == pytest.approx(7 / 3) and s["ratio_step"] == pytest.approx(1.1)


def test_the_training_code_binds_its_sizes_first():
    code = spmd.train_code(spmd.SIZES["smoke"])
    assert code.startswith("WIDTH = 16\nLAYERS = 2\nBATCH = 8\nSTEPS = 3\n")
    assert "fully_shard(model, mesh=mesh)" in code
    compile(spmd.TORCHRUN_MAIN.format(code=code), "spmd_step.py", "exec")


def test_tutorial_summary_medians_each_kind():
    rounds = [{"kind": "nbdist", "start_s": 2.0, "again_s": 0.4},
              {"kind": "torchrun", "done_s": 9.0, "crashes": []},
              {"kind": "mp.spawn", "done_s": 7.0, "crashes": []},
              {"kind": "mp.spawn", "done_s": 5.0, "crashes": []},
              {"kind": "torchrun", "done_s": 11.0,
               "crashes": ["terminate called without an active exception"] * 2},
              {"kind": "nbdist", "start_s": 1.0, "again_s": 0.2}]
    s = spmd.summarize_tutorial(rounds)
    assert s == pytest.approx({"nbdist_start_s": 1.5, "nbdist_again_s": 0.3,
                               "torchrun_s": 10.0, "mp_spawn_s": 6.0,
                               "torchrun_crashes": 2, "mp_spawn_crashes": 0})
    compile(spmd.DDP_TUTORIAL + spmd.DDP_ELASTIC + spmd.DDP_MAINS["torchrun"], "t.py", "exec")


def test_only_torchs_own_crashes_are_run_again():
    log = ("Start running basic DDP example on rank 1.\n"
           "terminate called without an active exception\n"
           "failed (exitcode: -6) local_rank: 1\n")
    assert spmd._torch_crash(log) == "terminate called without an active exception"
    assert spmd._torch_crash("Traceback ...\nKeyError: 'RANK'\n") is None
