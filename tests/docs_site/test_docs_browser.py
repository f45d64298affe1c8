"""The built documentation site in headless Chromium (issue 43): the index, a tutorial page
showing its plot, and the search page finding "scatter". The tutorial (13, views) is run for
the site first unless a run of its cells as they are exists; screenshots go to
tests/artifacts/ (docs_*.png)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ARTIFACTS, ROOT

pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")

TUTORIAL = "13_views"  # a tutorial that ends with a plot


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    env = dict(os.environ, NBDIST_DOCS_RUNS=str(tmp / "executed"))
    subprocess.run([sys.executable, "docs/execute_tutorials.py", "--only", TUTORIAL,
                    "--into", str(tmp / "executed")], cwd=ROOT, env=env, check=True,
                   timeout=600)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q",
                           "-b", "html", "docs", str(tmp / "site")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "tutorials shown with their outputs" in done.stdout, done.stdout
    return tmp / "site"


@pytest.mark.browser
@pytest.mark.timeout(900)
def test_the_site_shows_its_index_a_tutorial_plot_and_search_results(site, page):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.set_default_timeout(30_000)

    page.goto((site / "index.html").as_uri())
    assert "nbdist" in page.title()
    assert page.locator("a:has-text('Tutorials')").count() >= 1
    page.screenshot(path=str(ARTIFACTS / "docs_index.png"), full_page=True)

    page.goto((site / "tutorials" / f"{TUTORIAL}.html").as_uri())
    plots = page.locator("img[src*='.png']")
    assert plots.count() >= 1, "the tutorial page shows no plot"
    plot = plots.last
    plot.scroll_into_view_if_needed()
    width = plot.evaluate("img => img.complete ? img.naturalWidth : 0")
    assert width > 100, f"the plot did not load (natural width {width})"
    plot.screenshot(path=str(ARTIFACTS / "docs_tutorial_plot.png"))
    page.screenshot(path=str(ARTIFACTS / "docs_tutorial.png"), full_page=True)

    page.goto((site / "search.html").as_uri() + "?q=scatter")
    results = page.locator("#search-results li a")
    results.first.wait_for()
    found = [results.nth(i).inner_text() for i in range(results.count())]
    page.screenshot(path=str(ARTIFACTS / "docs_search.png"), full_page=True)
    assert any("View" in text or "views" in text.lower() for text in found), found
