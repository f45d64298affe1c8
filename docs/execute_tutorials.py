"""Run the tutorial notebooks for the docs site, so their pages show outputs and plots.

``python docs/execute_tutorials.py [--only REGEX]`` (``make docs`` runs it) executes each
``notebooks/NN_*.ipynb`` headless in a real kernel, in quick mode (``NBDIST_QUICK=1``, as the
tests run them) and in a temporary working directory, and writes the executed copy to
``docs/_build/executed/``. A notebook is run again only when its cells changed; a copy the
tests made (``tests/artifacts/``, same cells) counts as run. A notebook that fails is
reported and left out: its page then shows the notebook as committed, without outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "docs" / "_build" / "executed"
#: where executed copies are looked for, in order: ``$NBDIST_DOCS_RUNS`` (a folder, for a
#: test's own run), ours, then the tests' (``run_quick``)
RUNS = tuple(Path(p) for p in (os.environ.get("NBDIST_DOCS_RUNS"), EXECUTED,
                               ROOT / "tests" / "artifacts") if p)
CELL_TIMEOUT_S = 600

__all__ = ["EXECUTED", "RUNS", "cells_digest", "current_run", "execute", "main", "ran_through"]


def cells_digest(path: Path) -> str:
    """The digest of a notebook's cells (type and source), outputs and metadata aside."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    h = hashlib.sha256()
    for cell in nb.cells:
        h.update(f"{cell.cell_type}\0{cell.source}\0".encode())
    return h.hexdigest()


def ran_through(path: Path) -> bool:
    """Whether an executed copy ran every code cell, with an error only where a cell is tagged
    ``raises-exception`` (a run that failed stops at its first error)."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.get("execution_count") is None:
            return False
        tagged = "raises-exception" in cell.get("metadata", {}).get("tags", [])
        if not tagged and any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return False
    return True


def current_run(source: Path) -> Path | None:
    """An executed copy of ``source`` with its cells as they are now, run to its end."""
    want = cells_digest(source)
    for where in RUNS:
        ran = where / source.name
        if ran.is_file() and cells_digest(ran) == want and ran_through(ran):
            return ran
    return None


def execute(source: Path, into: Path = EXECUTED) -> Path:
    """Execute ``source`` in quick mode and write the executed copy into ``into``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(source), as_version=4)
    env = dict(os.environ, NBDIST_QUICK="1")
    with tempfile.TemporaryDirectory(prefix="nbdist-docs-") as cwd:
        client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": cwd}})
        saved = dict(os.environ)
        os.environ.update(env)  # the kernel inherits this process's environment
        try:
            client.execute()
        finally:
            os.environ.clear()
            os.environ.update(saved)
    into.mkdir(parents=True, exist_ok=True)
    out = into / source.name
    nbformat.write(nb, str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", metavar="REGEX", help="the notebooks whose name matches REGEX")
    ap.add_argument("--into", default=str(EXECUTED), help="where executed copies go")
    args = ap.parse_args(argv)
    into = Path(args.into)
    failed = []
    for source in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if args.only and not re.search(args.only, source.name):
            continue
        if current_run(source) is not None:
            continue
        t0 = time.monotonic()
        print(f"running {source.name} for the docs ...", flush=True)
        try:
            execute(source, into)
        except Exception as exc:  # noqa: BLE001 - one failed tutorial must not stop the rest
            first = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
            print(f"  {source.name} failed ({first[0][:200]}); its page shows no outputs",
                  flush=True)
            failed.append(source.name)
            continue
        print(f"  done in {time.monotonic() - t0:.0f}s", flush=True)
    if failed:
        print(f"{len(failed)} tutorial(s) not executed: {', '.join(failed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
