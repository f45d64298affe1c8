"""Headless Chromium for the browser tests: which one to drive (the ``page`` fixture, in
conftest, drives it).

Chromium: the one `make browser` installed (its path is in ``.venv/.chromium``), else
``chromium`` on PATH. Where neither exists a browser test is skipped, and the reason shows in
the pytest summary (``-ra``); where `make browser` did install it but it cannot be found, the
test fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

__all__ = ["CHROMIUM_ARGS", "MARKER", "chromium"]

# written by `make browser` when Chromium is installed: its path
MARKER = Path(os.environ.get("NBDIST_CHROMIUM_MARKER", ROOT / ".venv" / ".chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def chromium() -> str:
    """The Chromium to drive; skips (with the reason in the summary) where there is none,
    fails where `make browser` installed one that is gone."""
    installed = MARKER.read_text().strip() if MARKER.is_file() else None
    path = os.environ.get("NBDIST_CHROMIUM") or installed or shutil.which("chromium")
    if path and os.path.exists(path):
        return path
    if installed:
        pytest.fail(f"`make browser` installed Chromium ({MARKER} says {installed}) but "
                    f"{path} is missing: the browser test must run here, not be skipped",
                    pytrace=False)
    pytest.skip("browser test not run: Chromium not found (no `chromium` on PATH, no "
                f"{MARKER}); `make browser` installs it with apt-get")
