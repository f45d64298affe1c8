"""Pure renderers: matplotlib figures, PNG bytes and HTML from plain data.

Nothing here knows about widgets, kernels or clusters. Figures are ``matplotlib.figure.Figure``
objects with an Agg canvas, never pyplot: safe from a background thread, and the notebook's
backend is left alone. Past ``BAND_ABOVE`` ranks a value's curves become a band of min /
median / max with the straying ranks named (``display.bands``), and the status panel shows a
bar per group of alike ranks (``cluster.status_groups``). Data shapes: ``series`` ``{key:
{rank: curve}}``, a curve ``(steps, values)`` or, downsampled, ``(steps, values, mean steps,
running mean)`` (``display.collect.Envelope``); ``names`` ``{rank: name}``; ``samples``
``(wall time, caller, callee, function, latency s, bytes)`` (``tracing.samples``); ``rows``
``cluster.status.collect_status`` rows; ``timings`` ``{"observers", "mode", "seconds"}`` dicts
(``display.record_timing``).
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..cluster.status_groups import Line, group_rows
from ..rank_sets import SMALL, rank_set
from . import bands

__all__ = [
    "Snapshot",
    "StatusLine",
    "curve_points",
    "dashboard_figure",
    "draw_latency",
    "draw_metric",
    "draw_status",
    "draw_timings",
    "last_event_text",
    "latency_over_time",
    "latency_figure",
    "metrics_figure",
    "rank_color",
    "running_mean",
    "status_figure",
    "status_html",
    "status_lines",
    "thin",
    "timings_figure",
    "timings_table",
    "to_png",
]

DPI = 80
WIDTH = 9.0  # inches: 720 px at DPI
MAX_POINTS = 1500  # per raw curve; the running mean is computed on every point first
BAND_ABOVE = SMALL  # past this many ranks a value's curves are drawn as one band
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
EVENT_COLOR = "#cc3333"
_EMPTY_STYLE = {"ha": "center", "va": "center", "color": "#888", "fontsize": 10}


@dataclass
class Snapshot:
    """Everything one dashboard picture shows."""

    series: dict[str, dict[int, tuple[Sequence, Sequence]]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    samples: list[tuple] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)
    window: int = 20
    title: str = ""
    events: list[dict] = field(default_factory=list)  # telemetry.events: restarts, heals


def rank_color(rank: int) -> str:
    """The colour of a rank in every panel."""
    return _PALETTE[rank % len(_PALETTE)]


def new_figure(height: float, width: float = WIDTH) -> Figure:
    """A figure with an Agg canvas (no pyplot, no global state)."""
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def to_png(fig: Figure) -> bytes:
    """The figure as PNG bytes (fast compression: these are redrawn several times a second)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


def running_mean(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` values (fewer at the start), same length."""
    y = np.asarray(values, dtype=float)
    if y.size == 0 or window <= 1:
        return y.copy()
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.arange(1, y.size + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def thin(x: Sequence, y: Sequence, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points that keep the curve's shape: the first and the last, and
    the lowest and highest point of each of ``(max_points - 4) // 2`` equal slices."""
    x, y = np.asarray(x), np.asarray(y)
    n = y.size
    if n <= max_points:
        return x, y
    b = max(1, (max_points - 4) // 2)
    k = n // b
    base = np.arange(b) * k
    main = y[: b * k].reshape(b, k)
    picks = [np.array([0, n - 1]), base + main.argmin(axis=1), base + main.argmax(axis=1)]
    if b * k < n:
        tail = y[b * k:]
        picks.append(np.array([b * k + tail.argmin(), b * k + tail.argmax()]))
    idx = np.unique(np.concatenate(picks))
    return x[idx], y[idx]


def _label(rank: int, names: dict[int, str]) -> str:
    name = names.get(rank)
    return f"{name} (rank {rank})" if name and name != f"rank{rank}" else f"rank {rank}"


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, **_EMPTY_STYLE)
    ax.set_xticks([])
    ax.set_yticks([])


def curve_points(curve: Sequence, window: int,
                 max_points: int = MAX_POINTS) -> tuple[np.ndarray, ...]:
    """``(steps, values, mean steps, running mean)`` to draw, at most ``max_points`` each.

    ``curve`` is ``(steps, values)`` (every point: thinned here, the mean computed on all of
    them first) or already downsampled ``(steps, values, mean steps, mean values)``.
    """
    if len(curve) == 4:
        return tuple(np.asarray(c) for c in curve)
    steps, values = curve
    if len(values) == 0:
        empty = np.asarray([])
        return empty, empty, empty, empty
    xs, ys = thin(steps, values, max_points)
    xm, ym = thin(steps, running_mean(values, window), max_points)
    return xs, ys, xm, ym


def draw_metric(ax: Any, curves: dict[int, tuple[Sequence, Sequence]], key: str,
                names: dict[int, str] | None = None, window: int = 20,
                band_above: int = BAND_ABOVE) -> None:
    """One logged value: a faint raw line and a bold running mean per rank; past
    ``band_above`` ranks the band of their running means (min, median, max) and the ranks
    that stray from it (``display.bands``)."""
    names = names or {}
    ax.set_title(key, fontsize=10, loc="left")
    if not curves:
        _empty(ax, f"no '{key}' logged yet")
        return
    if len(curves) > band_above:
        means = {r: curve_points(c, window)[2:] for r, c in curves.items()}
        _draw_band(ax, means, name=lambda r: names.get(r, f"rank{r}"),
                   label=lambda r: _label(r, names))
    for rank in sorted(curves) if len(curves) <= band_above else ():
        xs, ys, xm, ym = curve_points(curves[rank], window)
        if len(ys) == 0:
            continue
        color = rank_color(rank)
        ax.plot(xs, ys, color=color, lw=0.7, alpha=0.35)
        ax.plot(xm, ym, color=color, lw=1.8, label=_label(rank, names))
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    ax.set_xlabel("step", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", frameon=False,
              title=f"mean of {window}" if window > 1 else None, title_fontsize=7)


def _draw_band(ax: Any, curves: dict[Any, tuple[Sequence, Sequence]], what: str = "ranks",
               name: Any = str, label: Any = str) -> None:
    """The band of ``curves`` (``{key: (x, y)}``) with its median bold, over the keys'
    ``name`` s; each stray its own line, ``label(key)``."""
    b = bands.band(curves)
    ax.fill_between(b.steps, b.lo, b.hi, color=_PALETTE[0], alpha=0.2, lw=0,
                    label=f"min-max of {len(b.ranks)} {what}")
    ax.plot(b.steps, b.mid, color=_PALETTE[0], lw=1.8,
            label=f"median of {rank_set(map(name, b.ranks))}")
    for i, key in enumerate(b.strays):
        ax.plot(*curves[key], color=_PALETTE[(i + 3) % len(_PALETTE)], lw=1.2,
                label=label(key))


def latency_over_time(samples: Sequence[tuple], bucket: float | None = None,
                      max_buckets: int = 60) -> dict[str, dict[str, np.ndarray]]:
    """Per destination: bucket start times (s since the first call), p50 and p95 latency (ms)
    and calls per second. ``bucket`` defaults to the span over ``max_buckets``, at least 0.5 s.
    """
    if not samples:
        return {}
    arr_t = np.fromiter((s[0] for s in samples), float, len(samples))
    arr_l = np.fromiter((s[4] for s in samples), float, len(samples)) * 1e3
    dests = np.array([s[2] for s in samples], dtype=object)
    t0 = float(arr_t.min())
    span = float(arr_t.max()) - t0
    if bucket is None:
        bucket = max(0.5, span / max_buckets)
    idx = ((arr_t - t0) // bucket).astype(int)
    out: dict[str, dict[str, np.ndarray]] = {}
    for dest in sorted(set(dests)):
        mask = dests == dest
        b, lat = idx[mask], arr_l[mask]
        order = np.argsort(b, kind="stable")
        b, lat = b[order], lat[order]
        keys, starts = np.unique(b, return_index=True)
        groups = np.split(lat, starts[1:])
        out[dest] = {
            "t": keys * bucket,
            "p50": np.array([np.percentile(g, 50) for g in groups]),
            "p95": np.array([np.percentile(g, 95) for g in groups]),
            "rate": np.array([len(g) for g in groups]) / bucket,
        }
        # the last bucket may be cut short by the end of the data: rate over what it covers
        last_start = t0 + keys[-1] * bucket
        covered = min(bucket, max(float(arr_t.max()) - last_start, bucket / 2))
        out[dest]["rate"][-1] = len(groups[-1]) / covered
    return out


def _dest_color(dest: str, names: dict[int, str]) -> str:
    for rank, name in names.items():
        if name == dest:
            return rank_color(rank)
    return _PALETTE[sum(map(ord, dest)) % len(_PALETTE)]


def draw_latency(ax_lat: Any, ax_rate: Any, samples: Sequence[tuple],
                 names: dict[int, str] | None = None,
                 events: Sequence[dict] = ()) -> None:
    """RPC latency per destination over time (p50 solid, p95 dashed) and calls per second;
    restarts that kept state and heals (``events``) as labelled dotted lines."""
    names = names or {}
    ax_lat.set_title("RPC latency by destination (p50 —, p95 - -)", fontsize=10, loc="left")
    ax_rate.set_title("RPC calls per second by destination", fontsize=10, loc="left")
    per = latency_over_time(samples)
    if not per:
        _empty(ax_lat, "no RPCs traced yet")
        _empty(ax_rate, "no RPCs traced yet")
        return
    if len(per) > BAND_ABOVE:
        ax_lat.set_title(f"RPC p50 latency, {len(per)} destinations", fontsize=10, loc="left")
        _draw_band(ax_lat, {d: (v["t"], v["p50"]) for d, v in per.items()}, "destinations")
        _draw_band(ax_rate, {d: (v["t"], v["rate"]) for d, v in per.items()}, "destinations")
    for dest, d in per.items() if len(per) <= BAND_ABOVE else ():
        color = _dest_color(dest, names)
        ax_lat.plot(d["t"], d["p50"], color=color, lw=1.6, marker=".", ms=3, label=dest)
        ax_lat.plot(d["t"], d["p95"], color=color, lw=1.0, ls="--")
        ax_rate.plot(d["t"], d["rate"], color=color, lw=1.6, marker=".", ms=3, label=dest)
    ax_lat.set_ylabel("ms", fontsize=8)
    ax_lat.set_ylim(bottom=0)
    ax_rate.set_ylabel("calls/s", fontsize=8)
    _draw_events(ax_lat, ax_rate, samples, events)
    for ax in (ax_lat, ax_rate):
        ax.set_xlabel("seconds", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, frameon=False, loc="best")


def _draw_events(ax_lat: Any, ax_rate: Any, samples: Sequence[tuple],
                 events: Sequence[dict]) -> None:
    """A dotted line at each event inside the traced span, named by its kind."""
    t0 = min(s[0] for s in samples)
    end = max(s[0] for s in samples)
    for ev in events:
        x = ev["time"] - t0
        if not 0 <= x <= end - t0 + 1.0:
            continue
        for ax in (ax_lat, ax_rate):
            ax.axvline(x, color=EVENT_COLOR, ls=":", lw=1.2)
        ax_lat.annotate(ev["kind"], (x, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(2, -10), textcoords="offset points", fontsize=7,
                        color=EVENT_COLOR)


def last_event_text(events: Sequence[dict]) -> str:
    """``heal 12:03:04`` for the newest event, or ""."""
    if not events:
        return ""
    import datetime

    ev = events[-1]
    return f"{ev['kind']} {datetime.datetime.fromtimestamp(ev['time']).strftime('%H:%M:%S')}"


def draw_status(ax: Any, rows: Sequence[dict], events: Sequence[dict] = ()) -> None:
    """CPU % per rank as bars (memory and state written beside them); dead ranks in red; the
    newest restart or heal in the title."""
    last = last_event_text(events)
    ax.set_title("cluster status" + (f" (last {last})" if last else ""), fontsize=10,
                 loc="left")
    if not rows:
        _empty(ax, "no world running")
        return
    labels, cpus, colors, notes = [], [], [], []
    for line in status_lines(rows):
        labels.append(line.label)
        cpus.append(line.cpu or 0.0)
        colors.append(line.color)
        notes.append(line.state + (f", {line.mem} MB" if line.mem != "-" else ""))
    y = np.arange(len(labels))
    ax.barh(y, cpus, color=colors, alpha=0.8)
    top = max([100.0, *cpus])
    for yi, cpu, note in zip(y, cpus, notes, strict=True):
        ax.text(cpu + top * 0.01, yi, f"{cpu:.0f}%  {note}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.6)
    ax.set_xlabel("CPU %", fontsize=8)
    ax.tick_params(labelsize=8)


def timings_table(timings: Sequence[dict]) -> tuple[list[int], list[str], np.ndarray]:
    """Observer counts, modes (first seen first) and the mean seconds of each (nan if none)."""
    observers = sorted({int(t["observers"]) for t in timings})
    modes: list[str] = []
    for t in timings:
        if t["mode"] not in modes:
            modes.append(t["mode"])
    sums = np.zeros((len(modes), len(observers)))
    counts = np.zeros_like(sums)
    for t in timings:
        i, j = modes.index(t["mode"]), observers.index(int(t["observers"]))
        sums[i, j] += float(t["seconds"])
        counts[i, j] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return observers, modes, means


def draw_timings(ax: Any, timings: Sequence[dict]) -> None:
    """Grouped bars: seconds per run by number of observers, one bar per mode."""
    ax.set_title("execution time by observers", fontsize=10, loc="left")
    if not timings:
        _empty(ax, "no timings recorded\n(nbdist.display.record_timing)")
        return
    observers, modes, means = timings_table(timings)
    x = np.arange(len(observers))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        ax.bar(x + (i - (len(modes) - 1) / 2) * width, np.nan_to_num(means[i]), width,
               label=mode, color=_PALETTE[i % len(_PALETTE)], alpha=0.85)
    ax.set_xticks(x, [str(o) for o in observers], fontsize=8)
    ax.set_xlabel("observers", fontsize=8)
    ax.set_ylabel("seconds", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, frameon=False)


def _metric_grid(fig: Figure, spec: Any, snap: Snapshot, keys: Sequence[str]) -> None:
    cols = 2 if len(keys) > 1 else 1
    sub = spec.subgridspec((len(keys) + cols - 1) // cols, cols, hspace=0.55, wspace=0.2)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(sub[i // cols, i % cols])
        draw_metric(ax, snap.series.get(key, {}), key, snap.names, snap.window)


def metric_rows(keys: Sequence[str]) -> int:
    """How many rows of plots ``keys`` take (two per row)."""
    return max(1, (len(keys) + 1) // 2)


def metrics_figure(snap: Snapshot, keys: Sequence[str] | None = None) -> Figure:
    """Per-rank curves of each logged value (two plots a row)."""
    keys = list(keys if keys is not None else snap.series)
    fig = new_figure(2.6 * metric_rows(keys))
    if not keys:
        _empty(fig.add_subplot(1, 1, 1), "no values logged yet: nbdist.log(reward=...) on any "
               "rank")
    else:
        _metric_grid(fig, fig.add_gridspec(1, 1)[0], snap, keys)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.9, bottom=0.15)
    return fig


def latency_figure(snap: Snapshot) -> Figure:
    """RPC latency percentiles and call rates per destination over time."""
    fig = new_figure(2.6)
    ax_lat, ax_rate = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    draw_latency(ax_lat, ax_rate, snap.samples, snap.names, snap.events)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.88, bottom=0.18, wspace=0.25)
    return fig


def status_figure(snap: Snapshot) -> Figure:
    """The status panel alone."""
    fig = new_figure(0.6 + 0.3 * max(len(status_lines(snap.rows)), 2), WIDTH / 2)
    draw_status(fig.add_subplot(1, 1, 1), snap.rows, snap.events)
    fig.subplots_adjust(left=0.25, right=0.97, top=0.85, bottom=0.2)
    return fig


def timings_figure(snap: Snapshot) -> Figure:
    """The batched-vs-unbatched bar chart alone."""
    fig = new_figure(2.6, WIDTH / 2)
    draw_timings(fig.add_subplot(1, 1, 1), snap.timings)
    fig.subplots_adjust(left=0.14, right=0.97, top=0.88, bottom=0.18)
    return fig


def dashboard_figure(snap: Snapshot, keys: Sequence[str] | None = None) -> Figure:
    """Every panel in one picture: values, RPC latency and rates, status, timings."""
    keys = list(keys if keys is not None else snap.series)
    mrows = metric_rows(keys)
    heights = [2.4 * mrows, 2.4, 2.4]
    height = sum(heights) + (0.4 if snap.title else 0.0)
    fig = new_figure(height)
    grid = fig.add_gridspec(3, 1, height_ratios=heights, hspace=0.45)
    if keys:
        _metric_grid(fig, grid[0], snap, keys)
    else:
        _empty(fig.add_subplot(grid[0]), "no values logged yet")
    sub = grid[1].subgridspec(1, 2, wspace=0.25)
    draw_latency(fig.add_subplot(sub[0]), fig.add_subplot(sub[1]), snap.samples, snap.names,
                 snap.events)
    sub = grid[2].subgridspec(1, 2, wspace=0.45)
    draw_status(fig.add_subplot(sub[0]), snap.rows, snap.events)
    draw_timings(fig.add_subplot(sub[1]), snap.timings)
    if snap.title:
        fig.suptitle(snap.title, fontsize=11, x=0.02, ha="left")
    top = 1.0 - (0.75 if snap.title else 0.35) / height
    fig.subplots_adjust(left=0.12, right=0.98, top=top, bottom=0.5 / height)
    return fig


@dataclass
class StatusLine:
    """One bar of the status panel: a rank, or past ``BAND_ABOVE`` workers a group of alike
    ranks (``cpu``: the highest of them; ``mem``: ``a`` or ``min-max`` MB)."""

    ranks: str
    names: str
    state: str
    cpu: float | None
    mem: str
    color: str
    alive: bool

    @property
    def label(self) -> str:
        one = "," not in self.ranks and "-" not in self.ranks[1:]
        return f"{self.ranks} {self.names}" if one else _shorten(self.names, 24)


def _shorten(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


def status_lines(rows: Sequence[dict], band_above: int = BAND_ABOVE) -> list[StatusLine]:
    """The status panel's bars: one per rank, or past ``band_above`` workers one per group
    of alike ranks, odd ones first (``cluster.status_groups.group_rows``)."""
    workers = sum(isinstance(r["rank"], int) and r["rank"] != 0 for r in rows)
    lines = group_rows(list(rows), band_above) if workers > band_above else \
        [Line([r]) for r in rows]
    out = []
    for line in lines:
        first, alive = line.rows[0], all(r.get("alive") for r in line.rows)
        cpus = [r["cpu"] for r in line.rows if r.get("cpu") is not None]
        rank = first["rank"] if isinstance(first["rank"], int) else 0
        state = line.state if len(line.rows) == 1 else f"{line.state}, {len(line.rows)} ranks"
        out.append(StatusLine(str(first["rank"]) if len(line.rows) == 1 else line.ranks,
                              str(first["name"]) if len(line.rows) == 1 else line.names,
                              state, max(cpus) if cpus else None,
                              line.values(lambda r: r.get("mem_mb"), ".0f"),
                              rank_color(rank) if alive else "#cc3333", alive))
    return out


def status_html(rows: Sequence[dict]) -> str:
    """An HTML table of the ranks with inline CPU bars; dead ranks in red; past
    ``BAND_ABOVE`` workers a row per group of alike ranks."""
    if not rows:
        return "<div class='nbdist-status'><i>no world running</i></div>"
    out = ["<table class='nbdist-status' cellpadding='4' "
           "style='border-collapse:collapse;font-size:12px'>",
           "<tr><th align=left>rank</th><th align=left>name</th><th align=left>state</th>"
           "<th align=left>CPU</th><th align=right>mem MB</th></tr>"]
    for line in status_lines(rows):
        cpu = line.cpu
        width = 0 if cpu is None else min(cpu, 200.0) / 2
        style = "" if line.alive else " style='color:#b00'"
        bar = (f"<div style='display:inline-block;width:{width:.0f}px;height:9px;"
               f"background:{line.color}'></div> {'-' if cpu is None else f'{cpu:.0f}%'}")
        out.append(f"<tr{style}><td>{html.escape(line.ranks)}</td>"
                   f"<td>{html.escape(line.names)}</td><td>{html.escape(line.state)}</td>"
                   f"<td style='min-width:130px'>{bar}</td>"
                   f"<td align=right>{line.mem}</td></tr>")
    out.append("</table>")
    return "".join(out)
