"""Notebooks 03 (batch-updating parameter server) and 04 (batched vs unbatched CartPole).

Both run headless in a real kernel through nbclient with ``NBDIST_QUICK=1``; a failing
assertion cell fails the test with the cell's traceback, and the tests read the printed and
displayed results back. The executed copies are kept in tests/artifacts/. The committed
notebooks must carry no outputs and follow the tutorial rules.
"""

from __future__ import annotations

import re

import pytest
from conftest import assert_follows_rules, run_checked

from nbdist.tutorials import batching

PS_NOTEBOOK = "03_batch_parameter_server.ipynb"
BATCH_NOTEBOOK = "04_batched_vs_unbatched.ipynb"






def _with_data(cell, mime: str) -> list:
    return [o for o in cell.get("outputs", []) if mime in o.get("data", {})]


@pytest.mark.parametrize("name", [PS_NOTEBOOK, BATCH_NOTEBOOK])
def test_notebook_is_clean_and_follows_the_rules(name):
    assert_follows_rules(name)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_batch_parameter_server_notebook_quick(tmp_path):
    nb, text, seconds = run_checked(PS_NOTEBOOK, cwd=tmp_path)
    # the zero_grad pitfall is shown, not just described
    assert "after zero_grad(): None" in text
    assert "p.grad += g fails" in text
    # both trainers ran on workers and their prints came back prefixed
    for name in ("trainer1", "trainer2"):
        assert re.search(rf"^\[{name}\] step \d+/\d+: loss \d+\.\d+", text, re.M), text
    m = re.search(r"all checks passed: (\d+) PS steps = (\d+) updates / (\d+); (\d+) trainers "
                  r"hold the PS's parameters", text)
    assert m, text
    steps, updates, size, trainers = map(int, m.groups())
    assert steps * size == updates and updates % trainers == 0 and steps > 0
    before, after = map(float, re.search(r"held-out accuracy: ([\d.]+)% before, ([\d.]+)% "
                                         r"after", text).groups())
    assert after > before
    assert any(_with_data(c, "image/png") for c in nb.cells)  # the loss plot
    assert "RRef Leak" not in text and "Leaking RRef" not in text
    print(f"{PS_NOTEBOOK} quick: {seconds:.1f}s")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_batched_vs_unbatched_notebook_quick(tmp_path):
    nb, text, seconds = run_checked(BATCH_NOTEBOOK, cwd=tmp_path)
    # the gymnasium API: reset gives (state, info), step a 5-tuple
    assert re.search(r"^step  -> \(array\(\[.*\]", text, re.M | re.S), text
    # the live table and chart: one output each, updated in place
    loop = next(c for c in nb.cells if c.cell_type == "code" and "chart_handle" in c.source)
    tables = _with_data(loop, "text/html")
    charts = _with_data(loop, "image/png")
    assert len(tables) == 1 and len(charts) == 1, loop.outputs
    table = tables[0]["data"]["text/html"]
    assert "speed-up" in table and "batched s" in table and "unbatched s" in table
    plain = tables[0]["data"]["text/plain"]
    assert [int(x) for x in re.findall(r"^\d+\s+(\d+)\s", plain, re.M)] == [1, 2], plain
    m = re.search(r"speed-up at 2 observers: (\d+\.\d+)x \(unbatched (\d+\.\d+)s / batched "
                  r"(\d+\.\d+)s\)", text)
    assert m, text
    speedup, unbatched, batched = map(float, m.groups())
    assert batched > 0 and unbatched > 0
    assert speedup == pytest.approx(unbatched / batched, rel=0.05, abs=0.01)
    assert "RRef Leak" not in text and "Leaking RRef" not in text
    print(f"{BATCH_NOTEBOOK} quick: {seconds:.1f}s")


def test_batching_table_and_chart_helpers():
    rows = [{"observers": 1, "mode": "batched", "seconds": 2.0},
            {"observers": 1, "mode": "unbatched", "seconds": 3.0},
            {"observers": 2, "mode": "batched", "seconds": 4.0}]
    assert batching.table(rows) == [
        {"observers": 1, "batched s": 2.0, "unbatched s": 3.0, "speed-up": 1.5},
        {"observers": 2, "batched s": 4.0, "unbatched s": None, "speed-up": None}]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    batching.plot_results(ax, rows)
    batching.plot_results(ax, rows)  # a redraw replaces the bars, it does not add to them
    assert len(ax.patches) == 3
    plt.close(fig)
    with pytest.raises(ValueError, match="mode must be one of"):
        batching.record(1, "both", 1.0)
