"""Pure renderers: figures, PNG and HTML from plain data, no notebook and no world needed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbdist.display import render
from nbdist.display.collect import MAX_BUCKETS, SeriesStore
from nbdist.telemetry import timing

PNG = b"\x89PNG\r\n\x1a\n"


def _series(n: int = 300) -> dict:
    return {"reward": {r: (list(range(n)), [math.sin(i / 20) + r for i in range(n)])
                       for r in (1, 2)},
            "loss": {1: (list(range(n)), [1 / (i + 1) for i in range(n)])}}


def _samples() -> list[tuple]:
    # worker1: 100 calls of 1 ms over 1 s; worker2: 10 calls of 10 ms over the same second
    out = [(100.0 + i / 100, "worker0", "worker1", "echo", 0.001, 600) for i in range(100)]
    out += [(100.0 + i / 10, "worker0", "worker2", "step", 0.010, 64) for i in range(10)]
    return sorted(out)


def _rows() -> list[dict]:
    return [{"rank": 0, "name": "agent", "alive": True, "state": "notebook", "cpu": 12.0,
             "mem_mb": 300.0},
            {"rank": 1, "name": "obs1", "alive": True, "state": "alive", "cpu": 95.0,
             "mem_mb": 200.0},
            {"rank": 2, "name": "obs2", "alive": False, "state": "killed by SIGKILL",
             "cpu": None, "mem_mb": None}]


def _timings() -> list[dict]:
    return [{"observers": o, "mode": m, "seconds": s}
            for o, m, s in [(1, "batch", 14.7), (1, "no batch", 13.8), (2, "batch", 15.3),
                            (2, "no batch", 18.0), (2, "no batch", 20.0)]]


def _snap(**kw) -> render.Snapshot:
    base = {"series": _series(), "names": {0: "agent", 1: "obs1", 2: "obs2"},
            "samples": _samples(), "rows": _rows(), "timings": _timings(), "title": "t"}
    base.update(kw)
    return render.Snapshot(**base)


def test_running_mean_is_trailing():
    m = render.running_mean([1, 2, 3, 4, 5], 2)
    assert np.allclose(m, [1, 1.5, 2.5, 3.5, 4.5])
    assert np.allclose(render.running_mean([3, 5], 1), [3, 5])
    assert render.running_mean([], 5).size == 0


def test_thin_caps_points_and_keeps_ends():
    x, y = render.thin(range(10_000), range(10_000), 100)
    assert len(x) <= 101 and x[0] == 0 and x[-1] == 9999 and np.array_equal(x, y)
    x, _ = render.thin([1, 2, 3], [1, 2, 3], 100)
    assert list(x) == [1, 2, 3]


def test_latency_over_time_percentiles_and_rates():
    per = render.latency_over_time(_samples(), bucket=0.5)
    assert set(per) == {"worker1", "worker2"}
    w1, w2 = per["worker1"], per["worker2"]
    assert list(w1["t"]) == [0.0, 0.5]
    assert np.allclose(w1["p50"], 1.0) and np.allclose(w2["p95"], 10.0)
    assert w1["rate"][0] == pytest.approx(100.0)  # 50 calls in the first half second
    assert w2["rate"][0] == pytest.approx(10.0)
    assert render.latency_over_time([]) == {}


def test_timings_table_means_by_mode_and_observers():
    observers, modes, means = render.timings_table(_timings())
    assert observers == [1, 2] and modes == ["batch", "no batch"]
    assert means[1, 1] == pytest.approx(19.0) and means[0, 0] == pytest.approx(14.7)


def test_metric_plot_has_a_raw_and_a_mean_line_per_rank():
    fig = render.metrics_figure(_snap(), ["reward"])
    ax = fig.axes[0]
    assert ax.get_title(loc="left") == "reward"
    assert len(ax.lines) == 4  # two ranks: raw + running mean each
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["obs1 (rank 1)", "obs2 (rank 2)"]
    mean_line = ax.lines[1]
    assert mean_line.get_color() == render.rank_color(1)
    assert render.to_png(fig).startswith(PNG)


def test_every_figure_renders_with_and_without_data():
    full, empty = _snap(), render.Snapshot()
    for make in (render.metrics_figure, render.latency_figure, render.status_figure,
                 render.timings_figure, render.dashboard_figure):
        for snap in (full, empty):
            png = render.to_png(make(snap))
            assert png.startswith(PNG) and len(png) > 1000, make.__name__
    fig = render.dashboard_figure(full)
    titles = {ax.get_title(loc="left") for ax in fig.axes}
    assert {"reward", "loss", "cluster status", "execution time by observers"} <= titles
    assert any(t.startswith("RPC latency") for t in titles)


def test_latency_plot_has_p50_and_p95_per_destination():
    fig = render.latency_figure(_snap())
    ax_lat, ax_rate = fig.axes
    assert len(ax_lat.lines) == 4 and len(ax_rate.lines) == 2
    assert [t.get_text() for t in ax_rate.get_legend().get_texts()] == ["worker1", "worker2"]


def test_status_draws_dead_ranks_red():
    fig = render.status_figure(_snap())
    bars = fig.axes[0].patches
    assert len(bars) == 3
    assert bars[2].get_facecolor()[:3] == pytest.approx((0.8, 0.2, 0.2), abs=0.01)


def test_status_html():
    text = render.status_html(_rows())
    assert "obs1" in text and "95%" in text and "killed by SIGKILL" in text
    assert "color:#b00" in text and text.count("<tr") == 4
    assert "no world running" in render.status_html([])


def test_timings_bars_group_by_mode():
    fig = render.timings_figure(_snap())
    ax = fig.axes[0]
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]


def test_record_timing_store_and_validation():
    timing.clear_timings()
    v = timing.timings_version()
    timing.record_timing(4, "batch", 17.6)
    assert timing.timings_version() != v
    assert [(t["observers"], t["mode"], t["seconds"]) for t in timing.timings()] == [
        (4, "batch", 17.6)]
    with pytest.raises(ValueError, match="observers"):
        timing.record_timing(-1, "batch", 1.0)
    with pytest.raises(ValueError, match="mode"):
        timing.record_timing(1, "", 1.0)
    timing.clear_timings()
    assert timing.timings() == []


def test_series_store_keeps_numbers_per_value_and_rank():
    store = SeriesStore()
    store.add([{"rank": 1, "name": "obs1", "step": 0, "time": 0.0, "reward": 1.0, "tag": "x"},
               {"rank": 2, "name": "obs2", "step": 0, "time": 0.0, "reward": 2},
               {"rank": 1, "name": "obs1", "step": 1, "time": 0.0, "reward": 3.0, "loss": 0.5}])
    assert store.keys() == ["reward", "loss"]
    snap = store.snapshot(["reward"])
    assert snap == {"reward": {1: ([0, 1], [1.0, 3.0]), 2: ([0], [2])}}
    assert store.names == {1: "obs1", 2: "obs2"} and store.count == 3


def test_public_names():
    import nbdist.display as d

    assert sorted(d.__all__) == d.__all__
    for name in d.__all__:
        assert hasattr(d, name)
    for name in render.__all__:
        assert hasattr(render, name)


def test_logged_batching_records_become_timings_not_curves():
    store = SeriesStore()
    store.add([{"rank": 0, "name": "agent", "step": 0, "time": 1.0, "batching_observers": 4,
                "batching_mode": "batched", "batching_seconds": 17.6},
               {"rank": 0, "name": "agent", "step": 1, "time": 2.0, "reward": 1.0}])
    assert store.keys() == ["reward"]
    rows = store.timing_rows()
    assert [(r["observers"], r["mode"], r["seconds"]) for r in rows] == [(4, "batched", 17.6)]
    assert timing.from_record({"reward": 1}) is None


def test_envelope_is_bounded_and_keeps_every_spike():
    from nbdist.display.collect import Envelope

    env = Envelope(100)
    values = [math.sin(i / 1000) for i in range(200_000)]
    values[123_457], values[7] = 50.0, -50.0  # two spikes a thinning by stride would miss
    for i, v in enumerate(values):
        env.append(i, v)
    x, y, mx, my = env.curve(window=20)
    assert len(x) <= 2 * 100 + 2 and len(mx) <= 100
    assert y.max() == 50.0 and x[y.argmax()] == 123_457
    assert y.min() == -50.0 and x[y.argmin()] == 7
    assert x[0] == 0 and x[-1] == 199_999 and (np.diff(x) >= 0).all()
    bulk = Envelope(100)
    bulk.extend(np.arange(200_000), np.asarray(values))
    assert bulk.curve(20)[1].max() == 50.0 and len(bulk) == len(env) == 200_000
    assert env.width > 20 and np.isclose(my[-1], np.mean(values[-env.counts[-1]:]))  # a bucket


def test_series_store_loads_a_large_history_and_snapshots_stay_small():
    from nbdist.telemetry import records

    records.clear_history()
    try:
        for r in (1, 2):
            records.deliver((r, f"obs{r}", [(i, 0.0, {"reward": float(i % 100), "tag": "t"})
                                             for i in range(50_000)], []))
        store = SeriesStore()
        store.attach()
        records.deliver((1, "obs1", [(50_000, 0.0, {"reward": 1000.0})], []))
        snap = store.snapshot(["reward"])
        assert store.count == 100_001 and store.keys() == ["reward"]
        for r, curve in snap["reward"].items():
            x, y, mx, my = curve
            assert len(x) <= 2 * MAX_BUCKETS + 2 and len(mx) <= MAX_BUCKETS
            assert y.min() == 0.0 and y.max() == (1000.0 if r == 1 else 99.0)
        fig = render.metrics_figure(render.Snapshot(series=snap), ["reward"])
        assert all(len(line.get_xdata()) <= 2 * MAX_BUCKETS + 2 for line in fig.axes[0].lines)
        store.detach()
    finally:
        records.clear_history()


# -- big worlds (issue 52): a band of the ranks' curves, a bar per group of alike ranks -------
def _many(ranks: int = 255, n: int = 400, stray: int = 77) -> dict:
    rng = np.random.default_rng(0)
    steps = list(range(n))
    return {r: (steps, (np.sin(np.arange(n) / 30) + 0.05 * rng.standard_normal(n)
                        + (3.0 if r == stray else 0.0)).tolist()) for r in range(1, ranks + 1)}


def test_past_the_threshold_a_value_is_a_band_with_the_stray_rank_named():
    from nbdist.display import bands

    curves = _many()
    b = bands.band({r: (np.asarray(x), np.asarray(y)) for r, (x, y) in curves.items()})
    assert b.strays == [77] and len(b.ranks) == 255 and len(b.steps) == bands.POINTS
    assert np.all(b.lo <= b.mid) and np.all(b.mid <= b.hi) and b.hi.max() > 3.5
    names = {r: f"worker{r}" for r in curves}
    fig = render.metrics_figure(render.Snapshot(series={"reward": curves}, names=names))
    ax = fig.axes[0]
    assert len(ax.lines) == 2 and len(ax.collections) == 1  # the median, the stray, the band
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["min-max of 255 ranks", "median of worker1-255", "worker77 (rank 77)"]
    few = render.metrics_figure(render.Snapshot(series={"reward": dict(list(curves.items())[:16])}))
    assert len(few.axes[0].lines) == 32  # 16 ranks: raw and mean each, as before


def test_a_band_of_alike_ranks_names_none_and_its_artists_do_not_grow_with_ranks():
    from nbdist.display import bands

    alike = {r: (np.arange(50.0), np.zeros(50)) for r in range(1, 300)}
    assert bands.band(alike).strays == []
    assert bands.band({}).steps.size == 0
    for ranks in (32, 255):
        fig = render.metrics_figure(render.Snapshot(series={"v": _many(ranks, stray=0)}))
        assert len(fig.axes[0].lines) == 1 and len(fig.axes[0].collections) == 1


def test_status_of_256_ranks_is_a_bar_per_group_odd_ones_first():
    rows = [{"rank": 0, "name": "agent", "alive": True, "state": "notebook", "cpu": 5.0,
             "mem_mb": 900.0, "host": None}]
    for r in range(1, 256):
        dead = r == 9
        rows.append({"rank": r, "name": f"worker{r}", "alive": not dead,
                     "state": "killed by SIGKILL" if dead else "alive",
                     "cpu": None if dead else 1.0, "mem_mb": None if dead else 400.0 + r % 3,
                     "host": None})
    lines = render.status_lines(rows)
    assert [(x.ranks, x.state) for x in lines] == [
        ("0", "notebook"), ("9", "killed by SIGKILL"), ("1-8,10-255", "alive, 254 ranks")]
    assert lines[2].label == "worker1-8,10-255" and lines[2].mem == "400-402"
    fig = render.status_figure(render.Snapshot(rows=rows))
    assert len(fig.axes[0].patches) == 3
    page = render.status_html(rows)
    assert page.count("<tr") == 4 and "worker1-8,10-255" in page and "color:#b00" in page
    assert len(render.status_lines(rows[:17])) == 17  # 16 workers: a bar each, as before


def test_rpc_panels_past_the_threshold_are_bands_naming_the_slow_destination():
    samples = [(100.0 + i / 10, "agent", f"worker{d}", "step", 0.050 if d == 30 else 0.001, 8)
               for d in range(1, 65) for i in range(40)]
    fig = render.latency_figure(render.Snapshot(samples=sorted(samples)))
    ax_lat, ax_rate = fig.axes
    assert ax_lat.get_title(loc="left") == "RPC p50 latency, 64 destinations"
    labels = [t.get_text() for t in ax_lat.get_legend().get_texts()]
    assert labels == ["min-max of 64 destinations", "median of worker1-64", "worker30"]
    assert len(ax_lat.lines) == 2 and len(ax_rate.collections) == 1
