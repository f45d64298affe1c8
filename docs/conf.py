"""Sphinx configuration of nbdist's documentation (``make docs``; offline, from the tree)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]  # our extension; nbdist and tests/

project = "nbdist"
author = "the nbdist developers"
copyright = "2026, the nbdist developers"  # noqa: A001 - Sphinx's name

extensions = [
    "myst_nb",  # Markdown pages (MyST) and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "nbdist_reference",  # the magics, errors and torch changes, generated from the code
    "nbdist_tutorials",  # notebooks/ as pages, with the outputs of a run where there is one
]
myst_heading_anchors = 3  # [text](page.md#a-heading) works as it does on GitHub
myst_enable_extensions = ["colon_fence"]
nb_execution_mode = "off"  # pages show docs/execute_tutorials.py's executed copies
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
suppress_warnings = ["myst.header"]  # pages start at "#", sections may skip a level
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "pydata_sphinx_theme"
html_title = "nbdist"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
html_static_path: list[str] = []
