"""The documentation site builds from the tree with no warning, every internal link and anchor
in it resolves, and the references made from the code name every magic flag, public function
and error class (issue 43). The README stays a page."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import ROOT

pytest.importorskip("sphinx")
pytest.importorskip("myst_nb")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q",
                           "-b", "html", str(ROOT / "docs"), str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"the docs build warned or failed:\n{done.stderr[-5000:]}"
    return out


def _text(page: Path) -> str:
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(), flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", raw)))


def test_every_internal_link_and_anchor_resolves(site):
    broken = []
    pages = [p for p in site.rglob("*.html") if "_static" not in p.parts]  # theme templates
    ids = {p: set(re.findall(r'\bid="([^"]+)"', p.read_text())) for p in pages}
    for page in pages:
        for href in re.findall(r'\bhref="([^"]+)"', page.read_text()):
            url = urlparse(html.unescape(href))
            if url.scheme or url.netloc or href.startswith("mailto:"):
                continue
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {href} (no such file)")
            elif url.fragment and target.suffix == ".html" and \
                    url.fragment not in ids.get(target, set()):
                broken.append(f"{page.relative_to(site)}: {href} (no such anchor)")
    assert not broken, "broken links in the built site:\n" + "\n".join(sorted(set(broken)))


def test_every_magic_and_flag_is_in_the_reference(site):
    from nbdist.magics import DistMagics

    text = _text(site / "reference" / "magics.html")
    missing = []
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name, attr in DistMagics.magics[kind].items():
            if prefix + name not in text:
                missing.append(prefix + name)
            parser = getattr(getattr(DistMagics, attr), "parser", None)
            for action in parser._actions if parser is not None else ():
                missing += [f"{prefix}{name} {flag}" for flag in action.option_strings
                            if flag not in text and flag not in ("-h", "--help")]
    assert not missing, f"not in reference/magics: {missing}"


def test_every_public_name_and_error_is_in_the_reference(site):
    import nbdist
    import nbdist.parallel
    from nbdist import errors

    api = _text(site / "reference" / "api.html")
    skip = {"__version__", "load_ipython_extension", *errors.RAISED}
    missing = [f"nbdist.{n}" for n in nbdist.__all__ if n not in skip and n not in api]
    missing += [f"nbdist.parallel.{n}" for n in nbdist.parallel.__all__ if n not in api]
    errs = _text(site / "reference" / "errors.html")
    missing += [f"nbdist.{n}" for n in errors.RAISED if f"nbdist.{n}" not in errs]
    assert not missing, f"not in the reference: {missing}"
    assert errs.count("What to do:") == len(errors.RAISED)


def test_search_finds_a_magic_and_an_api_name(site):
    index = (site / "searchindex.js").read_text()
    for term in ("scatter", "dist_start", "restart"):
        assert f'"{term}"' in index, f"the search index lacks {term!r}"


def test_the_readme_fits_on_a_page_and_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), f"README links to a missing page: {target}"


def test_every_tutorial_has_a_page(site):
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        page = site / "tutorials" / f"{nb.stem}.html"
        assert page.is_file(), f"no page for {nb.name}"
        assert nb.stem in (site / "tutorials.html").read_text(), f"tutorials.html omits {nb.stem}"


def test_module_notes_name_files_that_exist():
    """How it works' module notes follow the rooms: each ``name.py`` under a ``### `room/```
    heading is a file of that room (or of the package's top)."""
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    notes = text[text.index("## Module notes"):]
    rooms: list[str] = []
    missing = []
    for line in notes.splitlines():
        if line.startswith("### "):
            rooms = re.findall(r"`([a-z_]+)/`", line)
            continue
        for name in re.findall(r"^- \*\*`([a-z_]+\.py)`\*\*", line):
            places = [ROOT / "nbdist" / r / name for r in rooms] + [ROOT / "nbdist" / name]
            if not any(p.is_file() for p in places):
                missing.append(f"{name} under {rooms}")
    assert not missing, f"how-it-works.md names files that are not there: {missing}"
