"""The dashboard, progress lines, rank tabs and workers' widgets in a real JupyterLab,
driven by headless Chromium through Playwright.

A private JupyterLab (loopback, random free port, token, temp root and config dirs, no news
or update checks, read-only extension manager) serves a notebook that starts a world, shows
``nbdist.dashboard()`` and runs a logging cell that goes on until the test has seen the plot
change: while that cell is still running, two screenshots of the widget must differ (the plot
is updated live, in place). Screenshots go to tests/artifacts/. The server, its kernels and
the browser are always stopped.

Chromium: the one `make browser` installed (its path is in ``.venv/.chromium``), else
``chromium`` on PATH. Where neither exists the test is skipped, and the reason shows in the
pytest summary (``-ra``); where `make browser` did install it but it cannot be found, the
test fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import ARTIFACTS, ROOT, child_pids, free_port, wait_gone, wait_until

STOP_FILE = "stop-logging"  # the logging cell runs until the test makes this file
CELLS = [
    "%load_ext nbdist",
    "%dist_start 2",
    "import nbdist\nnbdist.dashboard()",
    "%%dist\nimport math, os, random, time, nbdist\nimport torch.distributed.rpc as rpc\n"
    "i = 0\nt0 = time.monotonic()\n"
    f"while not os.path.exists({STOP_FILE!r}) and time.monotonic() - t0 < 300:\n"
    "    nbdist.log(reward=math.sin(i / 15) + random.random() * 0.2)\n"
    "    rpc.rpc_sync('worker0', abs, args=(-i,))\n    i += 1\n    time.sleep(0.05)",
    "%dist_stop",
]


def _api(base: str, token: str, path: str, method: str = "GET") -> object:
    req = urllib.request.Request(f"{base}{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if body else None


PROGRESS_CELLS = [
    "%load_ext nbdist",
    "%dist_start 2",
    "%%dist\nimport os, time\ni = 0\n"
    f"while not os.path.exists({STOP_FILE!r}) and i < 3000:\n"
    "    print(f'\\rstep {i}', end='', flush=True)\n    i += 1\n    time.sleep(0.1)\n"
    "print()",
    "%dist_stop",
]


@pytest.fixture
def lab(tmp_path, request):
    """A private JupyterLab serving ``dash.ipynb`` (its cells: ``CELLS``, or the test's
    indirect parameter); yields (base url, token, its root)."""
    cells = getattr(request, "param", CELLS)
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(root / "dash.ipynb"))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[var] = str(tmp_path / sub)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for plugin, settings in (("notebook-extension/tracker", {"autoStartDefaultKernel": True}),
                             ("apputils-extension/notification", {"fetchNews": "false"})):
        path = tmp_path / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    log = open(tmp_path / "lab.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ServerApp.port={port}",
         "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.allow_remote_access=False", "--ServerApp.terminals_enabled=False",
         "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (tmp_path / "lab.log").read_text()[-3000:]) from None
                time.sleep(0.25)
        yield base, token, root
    finally:
        try:  # shut kernels down through the server: their atexit stops the nbdist world
            for k in _api(base, token, "/api/kernels") or []:
                _api(base, token, f"/api/kernels/{k['id']}", "DELETE")
        except Exception:  # noqa: BLE001 - the server may be gone already
            pass
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _prompt(page, index: int) -> str:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(
        ".jp-InputPrompt").inner_text().strip()


def _records(widget) -> int:
    found = re.search(r"([\d,]+) records", widget.first.inner_text())
    return int(found.group(1).replace(",", "")) if found else 0


def _wait(pred, timeout: float, what: str, page=None):
    """wait_until, with a screenshot of the page when it times out."""
    try:
        return wait_until(pred, timeout, what, interval=0.1)
    except AssertionError:
        if page is not None:
            page.screenshot(path=str(ARTIFACTS / "browser_timeout.png"))
        raise


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dashboard_updates_live_in_jupyterlab(lab, page):
    base, token, lab_root = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(120_000)
    page.goto(f"{base}/lab/tree/dash.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                           state="attached", timeout=120_000)
    _wait(lambda: "Idle" in page.locator(".jp-StatusBar-TextItem", has_text="|").first
          .inner_text(), 120, "the kernel to start", page)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

    widget = page.locator(".nbdist-dashboard")
    try:
        widget.first.wait_for(state="visible", timeout=120_000)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "browser_timeout.png"), full_page=True)
        raise
    plot = widget.first.locator("img").first  # the per-rank curves
    _wait(lambda: _records(widget) > 0, 180, "records from the logging cell", page)
    first = plot.screenshot(path=str(ARTIFACTS / "browser_plot_1.png"))
    widget.first.screenshot(path=str(ARTIFACTS / "browser_dashboard_1.png"))
    # the cell logs until told to stop, so any change seen here happened while it ran
    _wait(lambda: plot.screenshot() != first, 120, "the plot to change while the cell runs",
          page)
    plot.screenshot(path=str(ARTIFACTS / "browser_plot_2.png"))
    widget.first.screenshot(path=str(ARTIFACTS / "browser_dashboard_2.png"))
    assert _prompt(page, 3) == "[*]:", "the logging cell ended before the plot changed"
    (lab_root / STOP_FILE).touch()

    _wait(lambda: _prompt(page, 4).startswith("[") and _prompt(page, 4) not in ("[ ]:", "[*]:"),
          120, "the notebook to finish", page)
    page.screenshot(path=str(ARTIFACTS / "browser_page.png"), full_page=True)
    widget.first.screenshot(path=str(ARTIFACTS / "browser_dashboard_final.png"))
    assert widget.count() == 1, "the dashboard must stay one widget, updated in place"
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    texts = [errors.nth(i).inner_text() for i in range(errors.count())]
    assert not any("Traceback" in t for t in texts), texts
    kernels = _api(base, token, "/api/kernels")
    assert kernels, "the notebook's kernel should still be running"
    from nbdist.cluster.session import session

    own_template = {session().template_pid()}  # this pytest process's warm template stays
    pids_before = child_pids("ipykernel nbdist") - own_template
    for k in kernels:
        _api(base, token, f"/api/kernels/{k['id']}", "DELETE")
    assert not wait_gone(pids_before, 15.0), "kernel or workers outlived the kernel shutdown"


def _open_and_run_all(page, base: str, token: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(120_000)
    page.goto(f"{base}/lab/tree/dash.ipynb?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    _wait(lambda: "Idle" in page.locator(".jp-StatusBar-TextItem", has_text="|").first
          .inner_text(), 120, "the kernel to start", page)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def _bars(page) -> dict[str, list[str]]:
    """The text of every output line of the progress cell, by rank."""
    outs = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea-output")
    texts = [outs.nth(i).inner_text().strip() for i in range(outs.count())]
    return {name: [t for t in texts if t.startswith(f"[{name}] step")]
            for name in ("worker1", "worker2")}


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", [PROGRESS_CELLS], indirect=True)
def test_progress_bars_update_in_place_per_rank_in_jupyterlab(lab, page):
    """Issue 8: mid-run, both ranks' \\r progress lines show, one line each, and move."""
    base, token, lab_root = lab
    _open_and_run_all(page, base, token)
    _wait(lambda: all(_bars(page).values()), 180, "both ranks' progress lines", page)
    first = _bars(page)
    page.screenshot(path=str(ARTIFACTS / "browser_progress_1.png"), full_page=True)
    _wait(lambda: _bars(page) != first, 60, "the progress lines to move", page)
    moving = _bars(page)
    page.screenshot(path=str(ARTIFACTS / "browser_progress_2.png"), full_page=True)
    assert _prompt(page, 2) == "[*]:", "the cell ended before the lines moved"
    assert all(len(lines) == 1 for lines in moving.values()), moving  # one line per rank
    (lab_root / STOP_FILE).touch()
    _wait(lambda: _prompt(page, 3).startswith("[") and _prompt(page, 3) not in ("[ ]:", "[*]:"),
          120, "the notebook to finish", page)
    final = _bars(page)
    assert all(len(lines) == 1 for lines in final.values()), final
    page.screenshot(path=str(ARTIFACTS / "browser_progress_final.png"), full_page=True)


WIDGET_CELLS = [
    "%load_ext nbdist",
    "%dist_start 2",
    "%%dist --tabs\nimport os, time\ni = 0\n"
    f"while not os.path.exists({STOP_FILE!r}) and i < 3000:\n"
    "    print(f'step {i}', flush=True)\n    i += 1\n    time.sleep(0.1)",
    "%%dist --ranks 1\nimport os, time\nfrom tqdm.notebook import tqdm\n"
    "bar = tqdm(total=3000, desc='train')\n"
    f"while not os.path.exists({STOP_FILE + '-bar'!r}) and bar.n < 3000:\n"
    "    bar.update(1)\n    time.sleep(0.1)\nbar.close()",
    "%dist_stop",
]


def _cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def _tab_titles(page) -> list[str]:
    tabs = _cell(page, 2).locator(".lm-TabBar-tab")
    return [tabs.nth(i).inner_text().strip() for i in range(tabs.count())]


def _tab_text(page) -> str:
    """The text of the tab shown (worker1's, the first)."""
    panes = _cell(page, 2).locator(".widget-tab-contents .widget-html")
    return panes.first.inner_text() if panes.count() else ""


def _bar(page) -> tuple[str, str]:
    """(the label before the worker's tqdm bar, the bar's text: description and counts)."""
    outs = _cell(page, 3).locator(".jp-OutputArea-output")
    bar = _cell(page, 3).locator(".widget-hbox")
    if not bar.count():
        return "", ""
    return outs.first.inner_text().strip(), bar.first.inner_text().replace("\n", " ").strip()


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", [WIDGET_CELLS], indirect=True)
def test_rank_tabs_and_a_worker_tqdm_bar_update_live_in_jupyterlab(lab, page):
    """Issue 37: a --tabs cell shows a tab per rank whose text moves while it runs and whose
    badges end done; a tqdm.notebook bar made on a worker shows, labelled, and moves."""
    base, token, lab_root = lab
    _open_and_run_all(page, base, token)
    _wait(lambda: len(_tab_titles(page)) == 2 and "step" in _tab_text(page), 180,
          "a tab per rank with output", page)
    assert _tab_titles(page) == ["worker1 ⏳ running", "worker2 ⏳ running"]
    first = _tab_text(page)
    page.screenshot(path=str(ARTIFACTS / "browser_tabs_1.png"), full_page=True)
    _wait(lambda: _tab_text(page) != first, 60, "the tab's text to move", page)
    assert _prompt(page, 2) == "[*]:", "the cell ended before its tab moved"
    page.screenshot(path=str(ARTIFACTS / "browser_tabs_2.png"), full_page=True)
    (lab_root / STOP_FILE).touch()
    _wait(lambda: _tab_titles(page) == ["worker1 ✔ done", "worker2 ✔ done"], 60,
          "the badges to say done", page)

    _wait(lambda: re.search(r"train:.*\d+/3000", _bar(page)[1]), 120,
          "the worker's tqdm bar", page)
    label, shown = _bar(page)
    assert label == "[worker1]", label
    page.screenshot(path=str(ARTIFACTS / "browser_worker_bar_1.png"), full_page=True)
    _wait(lambda: _bar(page)[1] != shown, 60, "the worker's bar to move", page)
    assert _prompt(page, 3) == "[*]:", "the bar's cell ended before the bar moved"
    page.screenshot(path=str(ARTIFACTS / "browser_worker_bar_2.png"), full_page=True)
    (lab_root / (STOP_FILE + "-bar")).touch()
    _wait(lambda: _prompt(page, 4).startswith("[") and _prompt(page, 4) not in ("[ ]:", "[*]:"),
          120, "the notebook to finish", page)
    assert _cell(page, 3).locator(".widget-hbox").count() == 1, "one bar, updated in place"
    page.screenshot(path=str(ARTIFACTS / "browser_widgets_final.png"), full_page=True)


@pytest.mark.slow
def test_missing_chromium_is_a_visible_skip_or_a_failure(tmp_path):
    """Without Chromium the browser test is skipped with its reason in the summary; where
    `make browser` installed Chromium (its marker file exists) the same test fails."""
    def run(marker: Path) -> subprocess.CompletedProcess:
        env = dict(os.environ, NBDIST_CHROMIUM=str(tmp_path / "no-chromium"),
                   NBDIST_CHROMIUM_MARKER=str(marker), NBDIST_TEST_NO_WARM="1")
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
             f"{__file__}::test_dashboard_updates_live_in_jupyterlab"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    skipped = run(tmp_path / "no-marker")
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert re.search(r"SKIPPED \[1\] .*browser test not run: Chromium not found",
                     skipped.stdout), skipped.stdout
    marker = tmp_path / "chromium-marker"
    marker.write_text("/usr/bin/chromium\n")
    failed = run(marker)
    assert failed.returncode != 0, failed.stdout
    assert "the browser test must run here, not be skipped" in failed.stdout, failed.stdout
