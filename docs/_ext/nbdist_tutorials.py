"""The tutorial notebooks as pages of the site, with their outputs where they were run.

Before Sphinx looks for sources, ``docs/tutorials/`` (generated, git-ignored) is filled with
one notebook per ``notebooks/NN_*.ipynb``: an executed copy with the same cells (made by
``docs/execute_tutorials.py``, which ``make docs`` runs, or by the tests), else the notebook
as committed, whose page then says it was not run for this build.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.config import Config

DOCS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(DOCS))
from execute_tutorials import NOTEBOOKS, current_run  # noqa: E402

PAGES = DOCS / "tutorials"
NOT_RUN = ("```{note}\nThis page shows the notebook as committed, without outputs: it was "
           "not run for this build of the site. `make docs` runs every tutorial first.\n```")

__all__ = ["setup", "fill_pages"]


def fill_pages(pages: Path = PAGES) -> dict[str, bool]:
    """Put each tutorial in ``pages``; returns ``{name: shown with outputs}``."""
    import nbformat

    if pages.exists():
        shutil.rmtree(pages)
    pages.mkdir(parents=True)
    shown = {}
    for source in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        ran = current_run(source)
        if ran is not None:
            shutil.copyfile(ran, pages / source.name)
            shown[source.name] = True
            continue
        nb = nbformat.read(str(source), as_version=4)
        nb.cells.insert(1, nbformat.v4.new_markdown_cell(NOT_RUN))
        # stored without the kernel's language info: cells with magics are IPython, not Python
        nb.metadata.setdefault("language_info", {"name": "python"})
        nb.metadata.language_info.setdefault("pygments_lexer", "ipython3")
        nbformat.write(nb, str(pages / source.name))
        shown[source.name] = False
    return shown


def _on_config(app: Sphinx, config: Config) -> None:
    shown = fill_pages()
    ran = sum(shown.values())
    print(f"nbdist: {ran} of {len(shown)} tutorials shown with their outputs"
          + ("" if ran == len(shown) else " (`make docs` runs them)"))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("config-inited", _on_config)
    return {"version": "1", "parallel_read_safe": True}
