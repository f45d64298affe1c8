"""Notebook 07 (TorchOpt-style parallel training) runs headless in quick mode; its own last
cells assert that distributed losses and gradients equal the single-process ones."""

from __future__ import annotations

from conftest import NOTEBOOKS, cell_text, run_notebook


def test_notebook_07_torchopt_parallel_quick():
    nb = run_notebook(NOTEBOOKS / "07_torchopt_parallel.ipynb", env={"NBDIST_QUICK": "1"},
                      timeout=300)
    text = cell_text(nb)
    assert "all checks passed" in text
    assert "Greetings from worker(rank=1)!" in text and "Greetings from worker(rank=2)!" in text
    assert "rank 2 passed the barrier" in text
