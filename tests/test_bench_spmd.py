"""bench/spmd.py (issue 19, item 5): its summary is right, and ``--smoke`` runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
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


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_run_writes_both_results_with_the_commit(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "spmd.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=540,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "spmd.json").read_text())
    assert res["mode"] == "smoke" and [r["kind"] for r in res["rounds"]] == ["nbdist", "torchrun"]
    assert all(r["first_step_s"] > 0 and len(r["step_times"]) == 3 for r in res["rounds"])
    assert res["machine"]["nbdist"]["commit"]
    md = (tmp_path / "spmd.md").read_text()
    assert res["machine"]["nbdist"]["commit"] in md and "`torchrun --standalone`" in md
