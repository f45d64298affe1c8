"""The live dashboard: widgets redrawn by a background thread while a cell runs, only the
panels whose data changed; a picture file outside a notebook; a PNG that nbclient keeps."""

from __future__ import annotations

import base64
import os
import threading
import time

import nbformat
import pytest
from conftest import ARTIFACTS, WORLD_KINDS, assert_no_errors, run_notebook, wait_until

import nbdist
from nbdist.display import Dashboard, close_all, record_timing
from nbdist.telemetry import timing, tracing

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def clean():
    nbdist.clear_history()
    tracing.clear()
    timing.clear_timings()
    yield
    close_all()
    nbdist.clear_history()
    timing.clear_timings()


def _echo(x):
    return x


@WORLD_KINDS
def test_widget_updates_while_a_long_cell_runs(world, tmp_path, kind):
    c = world(2, rpc=not kind)
    enough = tmp_path / "seen-two-updates"  # the cell runs until the watcher saw them
    d = Dashboard(hz=10, widgets=True)
    d.refresh(force=True)  # the picture before the cell
    d.start()
    seen: list[tuple[float, bytes]] = []
    stop = threading.Event()

    def watch() -> None:  # what a frontend would receive: each new value of the image
        last = bytes(d._w_metrics.value)
        while not stop.is_set():
            v = bytes(d._w_metrics.value)
            if v != last:
                seen.append((time.monotonic(), v))
                last = v
                if len(seen) >= 2:
                    enough.touch()
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        t0 = time.monotonic()
        # the main thread is blocked in here until two redraws were seen (120 s: "hangs")
        c.run(f"import nbdist, os, time\nt0 = time.monotonic()\ni = 0\n"
              f"while not os.path.exists({str(enough)!r}):\n"
              f"    assert time.monotonic() - t0 < 120, 'no redraws while the cell ran'\n"
              f"    nbdist.log(reward=i % 7)\n    i += 1\n    time.sleep(0.05)\n", show=False)
        t1 = time.monotonic()
    finally:
        stop.set()
        watcher.join()
    during = [v for t, v in seen if t0 < t < t1]
    assert len(during) >= 2, f"only {len(during)} updates while the cell ran"
    assert all(v.startswith(PNG) for v in during)
    assert "worker1" in d._w_status.value and "alive" in d._w_status.value
    assert d.last_error is None
    assert d.running()
    d.close()
    assert not d.running()


def test_refresh_redraws_only_what_changed(world):
    c = world(1)
    d = Dashboard(widgets=True)  # no thread: refresh by hand
    assert d.refresh(force=True) == 3
    assert d.refresh() == 0
    nbdist.log(loss=1.0)
    assert d.refresh() == 1
    m = bytes(d._w_metrics.value)
    import torch.distributed.rpc as rpc

    rpc.rpc_sync(c.names[1], _echo, args=(1,))
    assert d.refresh() == 1 and bytes(d._w_metrics.value) == m
    record_timing(2, "batch", 3.0)
    assert d.refresh() == 1
    assert d.plot_keys() == ["loss"]
    d.close()


def test_picture_file_outside_a_notebook(world, tmp_path):
    c = world(1)
    path = str(tmp_path / "live.png")
    d = Dashboard(hz=20, widgets=False, save_to=path).start()
    wait_until(lambda: os.path.exists(path), 60, "the first picture file")
    first = open(path, "rb").read()
    assert first.startswith(PNG)
    c.run("import nbdist\nfor i in range(200):\n    nbdist.log(reward=i)\n", show=False)
    wait_until(lambda: open(path, "rb").read() != first, 60, "the picture file to be redrawn")
    saved = d.save(str(tmp_path / "run.png"))
    assert open(saved, "rb").read().startswith(PNG)
    d.save(str(tmp_path / "run.svg"))
    assert b"<svg" in open(tmp_path / "run.svg", "rb").read(200)
    d.close()
    assert sorted(os.listdir(tmp_path)) == ["live.png", "run.png", "run.svg"], "temp files left"


@WORLD_KINDS
def test_record_timing_from_a_worker_reaches_the_notebook(world, kind):
    c = world(1, rpc=not kind)
    c.run("from nbdist.display import record_timing\nrecord_timing(3, 'batched', 1.5)\n",
          show=False)  # internal records travel before the cell's result
    rows = [(t["observers"], t["mode"], t["seconds"], t["rank"]) for t in timing.timings()]
    assert rows == [(3, "batched", 1.5, 1)]
    assert nbdist.history() == [], "timings are not logged values"
    d = Dashboard(widgets=False)
    assert [t["mode"] for t in d.snapshot().timings] == ["batched"]
    d.close()


def test_bad_arguments():
    with pytest.raises(ValueError, match="hz"):
        Dashboard(hz=0, widgets=False)
    with pytest.raises(ValueError, match="window"):
        Dashboard(window=0, widgets=False)
    assert Dashboard(keys="a, b", widgets=False).plot_keys() == ["a", "b"]


NOTEBOOK = [
    "%load_ext nbdist\nimport nbdist, nbdist.display.magic\n"
    "nbdist.display.magic.register(get_ipython())",
    "%dist_start 1",
    "%dist_dashboard --hz 10",
    "%%dist\nimport nbdist\nfor i in range(50):\n    nbdist.log(reward=i)",
    "import nbdist.display\nnbdist.display.close_all()\n%dist_stop",
]


@pytest.mark.slow
@pytest.mark.kernel
@pytest.mark.timeout(300)
def test_headless_notebook_keeps_an_updated_picture(tmp_path):
    path = tmp_path / "dashboard_headless.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK]
    nbformat.write(nb, str(path))
    nb = run_notebook(path, timeout=120, save_to=ARTIFACTS / path.name)
    assert_no_errors(nb)
    outs = nb.cells[2]["outputs"]
    assert len(outs) == 1, "the dashboard is one output, updated in place"
    data = outs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in data
    png = base64.b64decode(data["image/png"])
    assert png.startswith(PNG)
    (ARTIFACTS / "dashboard_headless.png").write_bytes(png)
    # the picture was redrawn after the logging cell: its caption counts those records
    assert "50 records" in data["text/plain"], data["text/plain"]


def test_public_api_and_magic_are_wired(ipython):
    """``nbdist.dashboard``/``nbdist.rpc_stats`` and ``%dist_dashboard`` after ``%load_ext``."""
    import nbdist.display

    assert nbdist.dashboard is nbdist.display.dashboard
    assert nbdist.rpc_stats is tracing.rpc_stats
    assert {"dashboard", "rpc_stats"} <= set(nbdist.__all__)
    assert "dist_dashboard" in ipython.magics_manager.magics["line"]


def test_a_real_worlds_values_past_the_threshold_draw_as_a_band_naming_the_stray(world):
    """Issue 52: values logged by 4 real ranks, drawn with the band's threshold lowered to 2:
    one band, its median, and rank 3 (which logs 100 more) named on a line of its own."""
    from nbdist.display import render

    c = world(4)
    c.run("import os, nbdist\nrank = int(os.environ['NBDIST_RANK'])\n"
          "for i in range(50):\n    nbdist.log(reward=i + (100 if rank == 3 else 0))\n",
          show=False)
    d = Dashboard(widgets=False)
    try:
        wait_until(lambda: sorted(d.snapshot().series.get("reward", {})) == [1, 2, 3, 4], 30,
                   "every rank's values")
        snap = d.snapshot()
        fig = render.new_figure(3)
        ax = fig.add_subplot(1, 1, 1)
        render.draw_metric(ax, snap.series["reward"], "reward", snap.names, band_above=2)
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == ["min-max of 4 ranks", "median of worker1-4", "worker3 (rank 3)"]
        assert render.to_png(fig).startswith(PNG)
    finally:
        d.close()
