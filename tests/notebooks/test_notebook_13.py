"""Notebook 13 (issue 36: views) runs headless in quick mode: a data-parallel evaluation with
``c[:]`` (push, scatter, call, gather, map, choose, a failing rank), checked against the same
evaluation in one process by its checks cell."""

from __future__ import annotations

import pytest
from conftest import assert_follows_rules, run_checked

NAME = "13_views.ipynb"


def test_notebook_13_follows_the_rules():
    assert_follows_rules(NAME, forbidden=("rpc_sync(", "for r in range(1"))


@pytest.mark.timeout(300)
def test_notebook_13_views_quick(tmp_path):
    nb, text, seconds = run_checked(NAME, cwd=tmp_path)
    assert "gathered predictions equal: True" in text, text[-3000:]
    for r in range(1, 5):
        assert f"rank {r}: " in text
    assert "failed: ['[worker2] ValueError: rank 2 refuses']" in text
    assert any(out.get("output_type") == "display_data" and "image/png" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", [])), "no plot"
