"""Notebooks 08 (pipeline parallelism, RPC and torch.distributed.pipelining) and 09 (SPMD from a
notebook: DeviceMesh, DTensor, FSDP2, tensor parallel, distributed checkpoint), issue 19.

Both run headless in a real kernel through nbclient with ``NBDIST_QUICK=1``; their own checks
cells assert that every distributed result equals the single-process one, and the tests read
the printed numbers back. The executed copies are kept in tests/artifacts/.
"""

from __future__ import annotations

import re

import pytest
from conftest import assert_follows_rules, run_checked

PP_NOTEBOOK = "08_pipeline_parallel.ipynb"
SPMD_NOTEBOOK = "09_spmd.ipynb"
TOLERANCE = 1e-5
SCI = r"(\d\.\de[+-]\d\d)"  # a number as the notebooks print it: 1.5e-08


@pytest.mark.parametrize("name", [PP_NOTEBOOK, SPMD_NOTEBOOK])
def test_notebook_is_clean_and_follows_the_rules(name):
    assert_follows_rules(name, forbidden=(".cuda()", "torchvision", "torchrun"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pipeline_notebook_quick(tmp_path):
    nb, text, seconds = run_checked(PP_NOTEBOOK, cwd=tmp_path)
    # the RPC pipeline equals the reference: output, gradients, weights after the step
    m = re.search(r"RPC pipeline, 4 micro-batches: loss (\d\.\d+) \(reference (\d\.\d+)\); "
                  rf"largest differences: output {SCI}, gradients {SCI}, weights after the "
                  rf"step {SCI}", text)
    assert m, text[-3000:]
    assert m[1] == m[2]
    assert all(float(v) < TOLERANCE for v in m.groups()[2:]), m.groups()
    # both schedules: every rank's stage gradients and the last stage's output
    grads = re.findall(r"rank (\d), (ScheduleGPipe|Schedule1F1B): (\d+) parameter tensors "
                       rf"here, largest gradient difference {SCI}", text)
    assert {(r, s) for r, s, _, _ in grads} == {(str(r), s) for r in range(3)
                                                  for s in ("ScheduleGPipe", "Schedule1F1B")}
    assert all(float(e) < TOLERANCE for *_, e in grads), grads
    assert sum(int(n) for r, s, n, _ in grads if s == "ScheduleGPipe") == 14  # 6 blocks + head
    outs = re.findall(rf"(ScheduleGPipe|Schedule1F1B): output differs by {SCI};", text)
    assert len(outs) == 2 and all(float(e) < TOLERANCE for _, e in outs), outs
    # the chart was drawn live: one display, updated in place
    charts = [o for c in nb.cells for o in c.get("outputs", [])
              if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert len(charts) == 1, len(charts)
    for label in ("RPC: RRefs and futures", "pipelining: GPipe", "pipelining: 1F1B"):
        assert re.search(rf"{label}: (?:\d+: \d+\.\d ms(?:, )?)+", text), label
    print(f"08_pipeline_parallel quick: {seconds:.1f}s")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_spmd_notebook_quick(tmp_path):
    nb, text, seconds = run_checked(SPMD_NOTEBOOK, cwd=tmp_path)
    prefix = {0: r"(?<!\] )", 1: r"\[worker1\] ", 2: r"\[worker2\] ", 3: r"\[worker3\] "}
    for r, lead in prefix.items():
        # a 2x2 mesh, a block of the DTensor on every rank, and exact round trips
        assert re.search(rf"{lead}rank {r}: coordinate \[{r // 2}, {r % 2}\] in the 2x2 mesh",
                         text), text[-3000:]
        assert re.search(rf"{lead}rank {r}: block \(4, 4\) at \({4 * (r // 2)}, "
                         rf"{4 * (r % 2)}\), row shard \(2, 8\), round trips exact: True", text)
        # FSDP2: a quarter of every weight here, gradients and new weights as in one process
        m = re.search(rf"{lead}rank {r}: FSDPMLP, local shards \{{'fc1.weight': \(8, 16\)"
                      rf"[^}}]*\}}; gradient error {SCI}, weights after the step {SCI}", text)
        assert m and max(float(m[1]), float(m[2])) < TOLERANCE, (r, m)
        # tensor parallel: a quarter of fc1's rows and of fc2's columns
        m = re.search(rf"{lead}rank {r}: fc1.weight here \(8, 16\), fc2.weight here \(8, 8\); "
                      rf"output error {SCI}, gradient error {SCI}", text)
        assert m and max(float(m[1]), float(m[2])) < TOLERANCE, (r, m)
    assert "saved by 4 ranks: ['.metadata', '__0_0.distcp', '__1_0.distcp', '__2_0.distcp', " \
           "'__3_0.distcp']" in text
    # the world of another size: two ranks, half of every weight each, the saved weights exactly
    for r, lead in ((0, prefix[0]), (1, prefix[1])):
        assert re.search(rf"{lead}rank {r} of 2: local shards \{{'fc1.weight': \(16, 16\)", text)
    assert "saved by 4 ranks, loaded by 2: largest difference 0.0; all checks passed" in text
    # --grid: one table with a column per rank, each holding that rank's picture
    grids = [o for c in nb.cells for o in c.get("outputs", [])
             if "text/html" in o.get("data", {}) and "nbdist" in o.get("metadata", {})]
    assert len(grids) == 1, len(grids)
    assert grids[0]["metadata"]["nbdist"]["ranks"][-3:] == [1, 2, 3], grids[0]["metadata"]
    assert grids[0]["data"]["text/html"].count("data:image/png") >= 3
    print(f"09_spmd quick: {seconds:.1f}s")
