"""``nbdist.dashboard()``: a live ipywidgets panel of the logged values, RPCs and ranks.

Panels: per-rank curves of each logged value with a running mean, RPC latency and rate per
destination, cluster status, execution times (``record_timing``). A background thread redraws
only the panels whose data changed, at most ``hz`` times a second, by setting new PNG bytes on
``ipywidgets.Image`` widgets (in place: nothing cleared or appended); the output also carries a
static ``image/png`` for nbclient/nbconvert. Contract: nothing is written where the user did not
name a path (``save_to=``, ``save()``), and an ``atexit`` handler joins every dashboard's
thread before the cluster's own teardown. Details: docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import atexit
import base64
import datetime
import os
import tempfile
import threading
import weakref
from collections.abc import Sequence
from time import perf_counter
from typing import Any

from ..patches.installed import first_time
from ..telemetry import events, records, timing, tracing
from . import render
from .collect import SeriesStore

__all__ = ["Dashboard", "close_all", "dashboard"]

_DASHBOARDS_PER_PROCESS: weakref.WeakSet = weakref.WeakSet()
_VIEW = "application/vnd.jupyter.widget-view+json"
STATUS_EVERY = 1.0  # seconds between status samples
FILE_EVERY = 1.0  # seconds between picture files in a terminal
JOIN_SECONDS = 5.0  # how long close() waits for a redraw in progress


def _kernel_shell() -> Any:
    """The IPython shell if this runs in a Jupyter kernel (widgets can show), else None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return ip if ip is not None and getattr(ip, "kernel", None) is not None else None


class Dashboard:
    """A live view of one notebook's nbdist world. Use ``nbdist.dashboard()`` to make one."""

    def __init__(self, keys: Sequence[str] | str | None = None, window: int = 20,
                 hz: float = 5.0, max_keys: int = 4, save_to: str | None = None,
                 widgets: bool | None = None) -> None:
        if isinstance(keys, str):
            keys = [k.strip() for k in keys.split(",") if k.strip()]
        if hz <= 0:
            raise ValueError(f"dashboard: hz must be positive, got {hz!r}")
        if window < 1:
            raise ValueError(f"dashboard: window must be at least 1, got {window!r}")
        self.keys = list(keys) if keys else None
        self.window = int(window)
        self.interval = 1.0 / hz
        self.max_keys = max_keys
        self.save_to = save_to
        self.store = SeriesStore()
        self.store.attach()
        self.renders = 0  # panel pictures drawn (for tests and curiosity)
        self.last_error: str | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._seen: dict[str, Any] = {}
        self._status_at = 0.0
        self._rows: list[dict] = []
        self._file_at = 0.0
        self._file_seen: Any = None
        self._fallback_seen: Any = None
        self._handle: Any = None
        self._shell: Any = None
        self._skip_display = False
        self.widget: Any = None
        use_widgets = widgets if widgets is not None else _kernel_shell() is not None
        if use_widgets:
            self._build_widget()
        self._thread = threading.Thread(target=self._run, daemon=True, name="nbdist-dashboard")
        _register_exit_hook()
        _DASHBOARDS_PER_PROCESS.add(self)

    # ------------------------------------------------------------------ data
    def plot_keys(self) -> list[str]:
        """The logged values shown: ``keys`` if given, else the first ``max_keys`` seen."""
        return list(self.keys) if self.keys else self.store.keys()[: self.max_keys]

    def _status_rows(self, force: bool = False) -> list[dict]:
        now = perf_counter()
        if force or now - self._status_at >= STATUS_EVERY:
            from ..cluster.core import current
            from ..cluster.status import collect_status

            c = current()
            self._rows = collect_status(c).rows if c is not None else []
            self._status_at = now
        return self._rows

    def snapshot(self) -> render.Snapshot:
        """The data of one picture (see ``nbdist.display.render``)."""
        keys = self.plot_keys()
        rows = self._status_rows()
        names = dict(self.store.names)
        for r in rows:
            names.setdefault(r["rank"], r["name"])
        return render.Snapshot(series=self.store.snapshot(keys, self.window), names=names,
                               samples=tracing.samples(), rows=rows,
                               timings=timing.timings() + self.store.timing_rows(),
                               window=self.window,
                               title=self._title_text(rows), events=events.events())

    def _title_text(self, rows: list[dict]) -> str:
        alive = sum(1 for r in rows if r.get("alive"))
        when = datetime.datetime.now().strftime("%H:%M:%S")
        world = f"{alive}/{len(rows)} ranks alive" if rows else "no world running"
        last = render.last_event_text(events.events())
        return (f"nbdist dashboard: {world}, {self.store.count:,} records, "
                f"{tracing.total_calls():,} RPCs traced, {when}"
                + (f", last {last}" if last else ""))

    def _versions(self) -> dict[str, Any]:
        return {"metrics": (self.store.version, records.generation(), tuple(self.plot_keys())),
                "rpc": (tracing.version(), events.generation()),
                "timings": (timing.timings_version(), self.store.timings_version)}

    # ------------------------------------------------------------------ pictures
    def figure(self) -> Any:
        """Every panel in one matplotlib figure."""
        snap = self.snapshot()
        return render.dashboard_figure(snap, self.plot_keys())

    def png(self) -> bytes:
        """Every panel in one PNG."""
        self._status_rows(force=True)
        return render.to_png(self.figure())

    def save(self, path: str) -> str:
        """Write every panel to ``path`` (PNG, or any format matplotlib knows by extension).

        Written to a temporary file beside it, then renamed: readers never see half a file.
        """
        self._status_rows(force=True)
        fig = self.figure()
        folder, base = os.path.split(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                if path.lower().endswith(".png"):
                    f.write(render.to_png(fig))
                else:
                    fmt = os.path.splitext(path)[1].lstrip(".") or None
                    fig.savefig(f, dpi=render.DPI, format=fmt)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    # ------------------------------------------------------------------ widget
    def _build_widget(self) -> None:
        import ipywidgets as w

        px = int(render.WIDTH * render.DPI)
        self._w_title = w.HTML()
        self._w_metrics = w.Image(format="png", layout=w.Layout(width="100%",
                                                                max_width=f"{px}px"))
        self._w_rpc = w.Image(format="png", layout=w.Layout(width="100%", max_width=f"{px}px"))
        self._w_status = w.HTML(layout=w.Layout(width="50%", max_width=f"{px // 2}px"))
        self._w_timings = w.Image(format="png", layout=w.Layout(width="50%",
                                                                max_width=f"{px // 2}px"))
        self.widget = w.VBox([self._w_title, self._w_metrics, self._w_rpc,
                              w.HBox([self._w_status, self._w_timings])])
        self.widget.add_class("nbdist-dashboard")
        self.widget._view_count = 0  # count live views: 0 means no widget frontend saw it

    def refresh(self, force: bool = False) -> int:
        """Redraw the panels whose data changed (all if ``force``); returns how many."""
        with self._lock:
            if self.widget is None:
                return self._refresh_file(force)
            versions = self._versions()
            snap = self.snapshot()
            drawn = 0
            if force or versions["metrics"] != self._seen.get("metrics"):
                self._w_metrics.value = render.to_png(render.metrics_figure(snap,
                                                                            self.plot_keys()))
                drawn += 1
            if force or versions["rpc"] != self._seen.get("rpc"):
                self._w_rpc.value = render.to_png(render.latency_figure(snap))
                drawn += 1
            if force or versions["timings"] != self._seen.get("timings"):
                self._w_timings.value = render.to_png(render.timings_figure(snap))
                drawn += 1
            self._w_status.value = render.status_html(snap.rows)
            title = snap.title if self.last_error is None else (
                f"{snap.title} (last drawing error: {self.last_error})")
            self._w_title.value = f"<b>{title}</b>"
            self._seen = versions
            self.renders += drawn
            return drawn + self._refresh_file(force)

    def _refresh_file(self, force: bool) -> int:
        if self.save_to is None:
            return 0
        versions = self._versions()
        now = perf_counter()
        if not force and (versions == self._file_seen or now - self._file_at < FILE_EVERY):
            return 0
        self.save(self.save_to)
        self._file_seen, self._file_at = versions, now
        self.renders += 1
        return 1

    def _run(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            t0 = perf_counter()
            try:
                self.refresh()
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep the dashboard alive, say what broke
                self.last_error = f"{type(exc).__name__}: {exc}"
            wait = max(self.interval, 3.0 * (perf_counter() - t0))

    def start(self) -> Dashboard:
        """Start the background updates (``dashboard()`` does this)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()
        return self

    def running(self) -> bool:
        """Whether the background thread is updating the dashboard."""
        return self._thread.is_alive()

    # ------------------------------------------------------------------ display
    def _bundle(self) -> dict:
        png = self.png()
        self._fallback_seen = self._versions()
        bundle = {"image/png": base64.b64encode(png).decode("ascii"),
                  "text/plain": f"<nbdist dashboard: {self.store.count} records, "
                                f"{tracing.total_calls()} RPCs; live with ipywidgets>"}
        if self.widget is not None:
            view = self.widget._repr_mimebundle_()
            bundle[_VIEW] = view[_VIEW]
        return bundle

    def show(self) -> None:
        """Display the dashboard (again) in the current cell; all copies update together."""
        from IPython.display import display

        if self._shell is None:
            from IPython import get_ipython

            self._shell = get_ipython()
            if self._shell is not None:
                self._shell.events.register("post_run_cell", self._after_cell)
        if self.widget is None:
            if self.save_to is None:
                print("nbdist: no notebook frontend here, so the dashboard is not drawn; "
                      "`.save(path)` writes a picture, `save_to=path` keeps one up to date")
                return
            self.save(self.save_to)
            print(f"nbdist: no notebook frontend here; the dashboard is written to "
                  f"{self.save_to} (refreshed while data arrives)")
            return
        self.refresh(force=True)
        bundle = self._bundle()
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.display(bundle, raw=True)

    def _ipython_display_(self) -> None:
        if self._skip_display:  # dashboard() just displayed it; don't show it twice
            self._skip_display = False
            return
        self.show()

    def _after_cell(self, *_args: Any) -> None:
        """After each cell: refresh the static picture where no widget frontend is watching."""
        self._skip_display = False
        if self._stop.is_set() or self._handle is None or self.widget is None:
            return
        if (self.widget._view_count or 0) > 0 or self._versions() == self._fallback_seen:
            return
        try:
            with self._lock:
                self._handle.update(self._bundle(), raw=True)
        except Exception as exc:  # noqa: BLE001
            self.last_error = f"{type(exc).__name__}: {exc}"

    def close(self, timeout: float = JOIN_SECONDS) -> None:
        """Stop updating (the last picture stays); stops following the metrics stream.

        Waits up to ``timeout`` seconds for a redraw in progress to finish.
        """
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.store.detach()
        if self._shell is not None:
            try:
                self._shell.events.unregister("post_run_cell", self._after_cell)
            except ValueError:
                pass
            self._shell = None
        _DASHBOARDS_PER_PROCESS.discard(self)

    def __repr__(self) -> str:
        state = "live" if self.running() else "stopped"
        return f"<nbdist.Dashboard {state}: {', '.join(self.plot_keys()) or 'no values yet'}>"


def dashboard(keys: Sequence[str] | str | None = None, window: int = 20, hz: float = 5.0,
              max_keys: int = 4, save_to: str | None = None, show: bool = True) -> Dashboard:
    """Show a live dashboard of this notebook's world and return it.

    ``keys``: the logged values to plot (default: the first ``max_keys`` logged); ``window``:
    steps in the running mean; ``hz``: most redraws a second; ``save_to``: also keep a PNG
    file up to date (nothing is written unless a path is given).
    ``.save(path)`` writes a picture, ``.close()`` stops the updates.
    """
    d = Dashboard(keys=keys, window=window, hz=hz, max_keys=max_keys, save_to=save_to)
    if show:
        d.show()
        d._skip_display = True  # the cell's value would show it again
    return d.start()


def close_all(timeout: float = JOIN_SECONDS) -> None:
    """Stop every open dashboard of this process, within about ``timeout`` seconds in all."""
    deadline = perf_counter() + timeout
    dashes = list(_DASHBOARDS_PER_PROCESS)
    for d in dashes:
        d._stop.set()  # every thread stops at its next wake-up, not one after the other
    for d in dashes:
        d.close(max(0.0, deadline - perf_counter()))


def _register_exit_hook() -> None:
    """Close the dashboards at exit, before the cluster's own handler stops the world.

    ``atexit`` runs handlers last-registered first; importing ``nbdist.cluster.core`` first
    makes sure the cluster's handler is registered already.
    """
    if not first_time("display.live.close_all_at_exit"):
        return
    import nbdist.cluster.core  # noqa: F401 - registers its atexit handler first

    atexit.register(close_all)
