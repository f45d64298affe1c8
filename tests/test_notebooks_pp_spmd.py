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


@pytest.mark.parametrize("name", [PP_NOTEBOOK])
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
